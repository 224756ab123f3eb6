// Tensors -> params, shared by the CPU and CUDA bindings (the only code that sees at::Tensor).
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "params.h"

namespace sms {

enum class MaskKind { kNone, kBool, kSameAsX, kComputeType };

// "(2, 3, 4)": formatted with std::to_string, because streaming integers through iostreams from an extension
// crashes where the compiler's libstdc++ differs from the one the process loaded (seen with torch 2.11 wheels).
inline std::string shape_string(at::IntArrayRef sizes) {
  std::string text = "(";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + (sizes.size() == 1 ? ",)" : ")");
}

// Sizes aligned from the last dim, each 1 or equal to the target's.
inline bool broadcasts_to(at::IntArrayRef shape, at::IntArrayRef target) {
  if (shape.size() > target.size()) return false;
  const size_t leading = target.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1 && shape[d] != target[leading + d]) return false;
  }
  return true;
}

// The mask as the kernels read it: bool, x's dtype, or x's compute type (float, double for double),
// with a contiguous last dim, expanded (stride 0, never materialised) to x's shape.
struct PreparedMask {
  MaskKind kind = MaskKind::kNone;
  at::Tensor expanded;
};

// `t` with each dim of stride 0 (an expanded view's) taken at size 1, so that a conversion or copy of it does not
// write out what the view repeats.
inline at::Tensor without_repeats(const at::Tensor& t) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && sizes[d] > 1) sizes[d] = 1;
  }
  return t.as_strided(sizes, t.strides());
}

inline PreparedMask prepare_mask(const std::optional<at::Tensor>& mask, const at::Tensor& x) {
  if (!mask.has_value()) return {};
  TORCH_CHECK(mask->device() == x.device(), "mask must be on x's device (", x.device(), "), got ", mask->device());
  TORCH_CHECK(mask->dtype() == at::kBool || at::isFloatingType(mask->scalar_type()),
              "mask must be bool or floating, got ", mask->scalar_type());
  TORCH_CHECK_VALUE(broadcasts_to(mask->sizes(), x.sizes()), "mask of shape ", shape_string(mask->sizes()),
                    " does not broadcast to x of shape ", shape_string(x.sizes()));
  at::Tensor m = without_repeats(*mask);
  MaskKind kind = MaskKind::kBool;
  if (m.dtype() == x.dtype()) {
    kind = MaskKind::kSameAsX;
  } else if (m.dtype() != at::kBool) {
    // Converting on the mask's own (broadcast) shape keeps a float bias exact under a half-precision x.
    const auto compute_type = at::toOpMathType(x.scalar_type());
    kind = compute_type == x.scalar_type() ? MaskKind::kSameAsX : MaskKind::kComputeType;
    m = m.to(compute_type);
  }
  const int64_t cols = x.size(-1);
  if (m.dim() == 0) m = m.reshape({1});
  if (m.size(-1) == 1 && cols > 1) {
    std::vector<int64_t> keyed(m.sizes().begin(), m.sizes().end());
    keyed.back() = cols;
    m = m.expand(keyed);
  }
  if (m.size(-1) > 1 && m.stride(-1) != 1) m = m.contiguous();
  return {kind, m.expand(x.sizes())};
}

// The outer dims shared by `operands` (each of x's shape), size-1 dims dropped and neighbours merged where
// every operand allows; false when more than kMaxOuterDims remain.
inline bool collapse_rows(const std::vector<at::Tensor>& operands, RowShape& shape,
                          std::vector<RowStrides>& strides) {
  const auto sizes = operands.front().sizes();
  strides.assign(operands.size(), RowStrides{});
  shape.dims = 0;
  for (int64_t d = 0; d + 1 < static_cast<int64_t>(sizes.size()); ++d) {
    if (sizes[d] == 1) continue;
    bool merge = shape.dims > 0;
    for (size_t k = 0; merge && k < operands.size(); ++k) {
      merge = strides[k].stride[shape.dims - 1] == operands[k].stride(d) * sizes[d];
    }
    if (merge) {
      shape.size[shape.dims - 1] = Divisor(shape.size[shape.dims - 1].value * sizes[d]);
    } else {
      if (shape.dims == kMaxOuterDims) return false;
      shape.size[shape.dims++] = Divisor(sizes[d]);
    }
    for (size_t k = 0; k < operands.size(); ++k) strides[k].stride[shape.dims - 1] = operands[k].stride(d);
  }
  return true;
}

// Operands whose last dim is strided get a contiguous copy; the kernels read every row as contiguous.
inline at::Tensor with_contiguous_rows(const at::Tensor& t) {
  return t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

inline void check_causal(const char* name, const at::Tensor& scores, bool is_causal,
                         std::string_view causal_variant) {
  TORCH_CHECK(!is_causal || scores.dim() >= 2, "is_causal needs ", name,
              " with at least 2 dims [..., Sq, Sk], got shape ", shape_string(scores.sizes()));
  TORCH_CHECK(causal_variant == "upper_left" || causal_variant == "lower_right",
              "causal_variant must be 'upper_left' or 'lower_right', got '", causal_variant, "'");
}

// The kernels take scale in the scores' compute type: a scale beyond float's range would turn every score of a
// 16-bit or fp32 row into +-inf or NaN.
inline void check_scale(double scale, const char* name, const at::Tensor& scores) {
  const auto compute_type = at::toOpMathType(scores.scalar_type());
  const double largest = compute_type == at::kDouble ? std::numeric_limits<double>::max()
                                                     : std::numeric_limits<float>::max();
  if (std::abs(scale) <= largest) return;
  char text[32];  // formatted apart from iostreams, as shape_string's numbers are
  std::snprintf(text, sizeof(text), "%g", scale);
  TORCH_CHECK_VALUE(false, "scale must be finite in ", name, "'s compute type (", compute_type, "), got ", text);
}

inline void check_x(const at::Tensor& x, bool is_causal, std::string_view causal_variant) {
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "x must be float16, bfloat16, float32 or float64, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() >= 1, "x must have at least 1 dim, got a 0-d tensor");
  check_causal("x", x, is_causal, causal_variant);
}

// Row r holds query r % Sq; "lower_right" aligns the last query with the last key.
template <typename Params>
void set_causal_limit(const at::Tensor& scores, bool is_causal, std::string_view causal_variant, Params& p) {
  p.queries = Divisor(scores.dim() >= 2 ? scores.size(-2) : 1);
  p.is_causal = is_causal;
  p.causal_offset = causal_variant == "lower_right" ? scores.size(-1) - p.queries.value : 0;
}

// Fills `p` for x (and the returned tensors, which must outlive the launch) and allocates y.
struct ForwardOperands {
  at::Tensor x, mask, y;
  MaskKind mask_kind;
};

inline ForwardOperands make_forward_params(const at::Tensor& x_in, const std::optional<at::Tensor>& mask_in,
                                           double scale, bool is_causal, std::string_view causal_variant,
                                           ForwardParams& p) {
  check_x(x_in, is_causal, causal_variant);
  check_scale(scale, "x", x_in);
  at::Tensor x = with_contiguous_rows(x_in);
  PreparedMask mask = prepare_mask(mask_in, x);
  std::vector<at::Tensor> operands{x};
  if (mask.kind != MaskKind::kNone) operands.push_back(mask.expanded);
  std::vector<RowStrides> strides;
  if (!collapse_rows(operands, p.shape, strides)) {
    // Only reachable with more than six non-mergeable outer dims: copy into a layout that merges.
    for (auto& t : operands) t = t.contiguous();
    x = operands[0];
    if (mask.kind != MaskKind::kNone) mask.expanded = operands[1];
    collapse_rows(operands, p.shape, strides);
  }
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  p.x = x.data_ptr();
  p.mask = mask.kind == MaskKind::kNone ? nullptr : mask.expanded.data_ptr();
  p.y = y.data_ptr();
  p.cols = x.size(-1);
  p.output_row_stride = p.cols;
  p.rows = p.cols == 0 ? 0 : x.numel() / p.cols;
  p.x_strides = strides[0];
  p.mask_strides = mask.kind == MaskKind::kNone ? RowStrides{} : strides[1];
  p.x_end = static_cast<const char*>(p.x) + rows_extent(p.shape, p.x_strides, p.cols) * x.element_size();
  if (p.mask != nullptr) {
    p.mask_end =
        static_cast<const char*>(p.mask) + rows_extent(p.shape, p.mask_strides, p.cols) * mask.expanded.element_size();
  }
  set_causal_limit(x, is_causal, causal_variant, p);
  p.scale = scale;
  return {x, mask.expanded, y, mask.kind};
}

struct BackwardOperands {
  at::Tensor y, dy, dx;
};

inline BackwardOperands make_backward_params(const at::Tensor& y_in, const at::Tensor& dy_in, double scale,
                                             bool is_causal, std::string_view causal_variant, BackwardParams& p) {
  TORCH_CHECK(at::isFloatingType(y_in.scalar_type()), "y must be floating, got ", y_in.scalar_type());
  check_causal("y", y_in, is_causal, causal_variant);
  TORCH_CHECK(dy_in.sizes() == y_in.sizes(), "dy must have y's shape ", shape_string(y_in.sizes()), ", got ",
              shape_string(dy_in.sizes()));
  TORCH_CHECK(dy_in.device() == y_in.device(), "dy must be on y's device (", y_in.device(), "), got ",
              dy_in.device());
  TORCH_CHECK(y_in.dim() >= 1, "y must have at least 1 dim, got a 0-d tensor");
  check_scale(scale, "y", y_in);
  at::Tensor y = with_contiguous_rows(y_in);
  at::Tensor dy = with_contiguous_rows(dy_in.to(y.scalar_type()));
  std::vector<at::Tensor> operands{y, dy};
  std::vector<RowStrides> strides;
  if (!collapse_rows(operands, p.shape, strides)) {
    y = y.contiguous();
    dy = dy.contiguous();
    operands = {y, dy};
    collapse_rows(operands, p.shape, strides);
  }
  at::Tensor dx = at::empty(y.sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
  p.y = y.data_ptr();
  p.dy = dy.data_ptr();
  p.dx = dx.data_ptr();
  p.cols = y.size(-1);
  p.output_row_stride = p.cols;
  p.rows = p.cols == 0 ? 0 : y.numel() / p.cols;
  p.y_strides = strides[0];
  p.dy_strides = strides[1];
  p.y_end = static_cast<const char*>(p.y) + rows_extent(p.shape, p.y_strides, p.cols) * y.element_size();
  p.dy_end = static_cast<const char*>(p.dy) + rows_extent(p.shape, p.dy_strides, p.cols) * dy.element_size();
  set_causal_limit(y, is_causal, causal_variant, p);
  p.scale = scale;
  return {y, dy, dx};
}

// backward_with_bias_grad's bias_rows: row r of y took bias row r % bias_rows.
inline void check_bias_rows(int64_t bias_rows, const BackwardParams& p) {
  // Numbers through std::to_string, as in shape_string.
  TORCH_CHECK_VALUE(bias_rows >= 1 && p.rows % bias_rows == 0, "bias_rows must be a positive divisor of y's ",
                    std::to_string(p.rows), " rows, got ", std::to_string(bias_rows));
}

// Sets `p` for backward_with_bias_grad's sums over the rows of each bias row in parts, enough that at least `groups`
// groups of sums (a part of one bias row's rows each; as many as run at once) are formed where the rows allow, and
// one at least (p.rows > 0); and allocates them: [parts, bias_rows, cols] in y's compute type.
inline at::Tensor make_bias_grad_parts(const at::Tensor& y, int64_t bias_rows, int64_t groups, BackwardParams& p) {
  const int64_t repeats = p.rows / bias_rows;
  const int64_t wanted = std::clamp<int64_t>((groups + bias_rows - 1) / bias_rows, 1, repeats);
  p.rows_per_part = (repeats + wanted - 1) / wanted;
  const int64_t parts = (repeats + p.rows_per_part - 1) / p.rows_per_part;
  p.bias_rows = Divisor(bias_rows);
  p.bias_grad_rows = parts * bias_rows;
  at::Tensor sums = at::empty({parts, bias_rows, p.cols}, y.options().dtype(at::toOpMathType(y.scalar_type())));
  p.bias_grad = sums.data_ptr();
  return sums;
}

// The bias's gradient, [bias_rows, cols], from its parts' sums (make_bias_grad_parts).
inline at::Tensor bias_grad_of_parts(const at::Tensor& sums) { return sums.size(0) == 1 ? sums[0] : sums.sum(0); }

// backward_with_bias_grad's bias gradient where y has no rows: zeros.
inline at::Tensor zero_bias_grad(const at::Tensor& y, int64_t bias_rows, const BackwardParams& p) {
  return at::zeros({bias_rows, p.cols}, y.options().dtype(at::toOpMathType(y.scalar_type())));
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls body(TypeTag<mask_t>{}) for the mask type the kernels read.
template <typename scalar_t, typename Body>
void dispatch_mask(MaskKind kind, Body&& body) {
  using compute_t = at::opmath_type<scalar_t>;
  switch (kind) {
    case MaskKind::kNone: return body(TypeTag<NoMask>{});
    case MaskKind::kBool: return body(TypeTag<bool>{});
    case MaskKind::kSameAsX: return body(TypeTag<scalar_t>{});
    case MaskKind::kComputeType:
      if constexpr (!std::is_same_v<compute_t, scalar_t>) return body(TypeTag<compute_t>{});
  }
  TORCH_CHECK(false, "internal error: unexpected mask kind");
}

}  // namespace sms
