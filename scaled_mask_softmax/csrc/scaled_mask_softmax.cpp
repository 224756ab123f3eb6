// The operator's schema and its CPU kernels.
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "binding.h"

// `import scaled_mask_softmax._C` loads this library, whose static initialisers register the operators.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

namespace sms {
namespace {

// Rows per parallel task: enough work per task to hide the scheduling cost on short rows.
int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// y = softmax(scale * x + mask), one pass over each row into a buffer of fp32 (fp64 for fp64) scores.
template <typename scalar_t, typename mask_t>
void forward_cpu(const ForwardParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* mask = static_cast<const mask_t*>(p.mask);
  auto* y = static_cast<scalar_t*>(p.y);
  const acc_t scale = static_cast<acc_t>(p.scale);
  at::parallel_for(0, p.rows, rows_per_task(p.cols), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> scores(p.cols);
    for (int64_t row = begin; row < end; ++row) {
      int64_t x_start, mask_start;
      row_starts(p.shape, row, p.x_strides, p.mask_strides, x_start, mask_start);
      const int64_t visible = visible_end(p, row);
      acc_t row_max = -std::numeric_limits<acc_t>::infinity();
      for (int64_t col = 0; col < visible; ++col) {
        acc_t s = static_cast<acc_t>(x[x_start + col]) * scale;
        if constexpr (has_mask_v<mask_t>) s += additive_mask<acc_t>(mask[mask_start + col]);
        scores[col] = s;
        row_max = std::isnan(s) || s > row_max ? s : row_max;
      }
      // A fully masked row (max -inf) shifts by 0, sums to 0 and is written as zeros.
      const acc_t shift = row_max == -std::numeric_limits<acc_t>::infinity() ? acc_t(0) : row_max;
      // Summed in double: a long row of fp32 terms added one by one would lose about sqrt(cols) ulps.
      double sum = 0;
      for (int64_t col = 0; col < visible; ++col) {
        scores[col] = std::exp(scores[col] - shift);
        sum += scores[col];
      }
      const acc_t inverse = sum == 0 ? acc_t(0) : static_cast<acc_t>(1 / sum);
      scalar_t* y_row = y + row * p.cols;
      for (int64_t col = 0; col < visible; ++col) y_row[col] = static_cast<scalar_t>(scores[col] * inverse);
      // 0 * inverse rather than 0: a row whose sum is NaN is NaN everywhere, as torch.softmax gives.
      const scalar_t hidden = static_cast<scalar_t>(acc_t(0) * inverse);
      for (int64_t col = visible; col < p.cols; ++col) y_row[col] = hidden;
    }
  });
}

// dx = scale * y * (dy - sum(dy * y)).
template <typename scalar_t>
void backward_cpu(const BackwardParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto* y = static_cast<const scalar_t*>(p.y);
  const auto* dy = static_cast<const scalar_t*>(p.dy);
  auto* dx = static_cast<scalar_t*>(p.dx);
  const acc_t scale = static_cast<acc_t>(p.scale);
  at::parallel_for(0, p.rows, rows_per_task(p.cols), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      int64_t y_start, dy_start;
      row_starts(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
      const int64_t visible = visible_end(p, row);
      double dot = 0;
      for (int64_t col = 0; col < visible; ++col) {
        dot += static_cast<double>(y[y_start + col]) * static_cast<double>(dy[dy_start + col]);
      }
      const acc_t row_dot = static_cast<acc_t>(dot);
      scalar_t* dx_row = dx + row * p.cols;
      for (int64_t col = 0; col < visible; ++col) {
        const acc_t y_value = static_cast<acc_t>(y[y_start + col]);
        dx_row[col] = static_cast<scalar_t>(scale * y_value * (static_cast<acc_t>(dy[dy_start + col]) - row_dot));
      }
      std::fill(dx_row + visible, dx_row + p.cols, scalar_t(0));
    }
  });
}

at::Tensor forward_cpu_op(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale,
                          bool is_causal, c10::string_view causal_variant) {
  ForwardParams p;
  ForwardOperands operands =
      make_forward_params(x, mask, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scaled_mask_softmax_forward", [&] {
    dispatch_mask<scalar_t>(operands.mask_kind, [&](auto mask_tag) {
      forward_cpu<scalar_t, typename decltype(mask_tag)::type>(p);
    });
  });
  return operands.y;
}

at::Tensor backward_cpu_op(const at::Tensor& y, const at::Tensor& dy, double scale, bool is_causal,
                           c10::string_view causal_variant) {
  BackwardParams p;
  BackwardOperands operands = make_backward_params(
      y, dy, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.dx;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "scaled_mask_softmax_backward",
                                  [&] { backward_cpu<scalar_t>(p); });
  return operands.dx;
}

}  // namespace

TORCH_LIBRARY(scaled_mask_softmax, m) {
  m.def("forward(Tensor x, Tensor? mask, float scale, bool is_causal, str causal_variant) -> Tensor");
  // The backward of forward with the same scale and causal limit: hidden keys are not read, their gradient is 0.
  m.def(
      "backward(Tensor y, Tensor dy, float scale, bool is_causal=False, str causal_variant=\"upper_left\") -> Tensor");
}

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CPU, m) {
  m.impl("forward", &forward_cpu_op);
  m.impl("backward", &backward_cpu_op);
}

}  // namespace sms
