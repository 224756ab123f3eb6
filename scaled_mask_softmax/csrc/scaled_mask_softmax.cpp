// The operator's schema and its CPU kernels.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <Python.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>

#include "binding.h"
#include "cpu_kernels.h"

// `import scaled_mask_softmax._C` loads this library, whose static initialisers register the operators.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

namespace sms {
namespace {

// Rows per parallel task: enough work per task to hide the scheduling cost on short rows.
int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// The engine compiled for the baseline instruction set (16-byte vectors, SSE2 on x86-64), and on x86-64 for AVX2
// and AVX-512 too (with F16C, which every CPU with AVX2 has), of which the widest that torch's own CPU kernels take
// (ATEN_CPU_CAPABILITY, or the CPU's) runs. Each takes vectors of one register of the compute type.
template <int kRegisterBytes, bool kF16C, typename acc_t>
using EngineFor = cpu::Engine<kRegisterBytes / static_cast<int>(sizeof(acc_t)), kF16C>;

#if defined(__GNUC__)
template <typename acc_t>
using BaselineEngine = EngineFor<16, false, acc_t>;
#else
template <typename acc_t>
using BaselineEngine = cpu::Engine<1, false>;
#endif

template <typename scalar_t, typename mask_t, typename acc_t>
void forward_rows(const ForwardParams& p, int64_t begin, int64_t end, acc_t* scores) {
  BaselineEngine<acc_t>::template forward_rows<scalar_t, mask_t>(p, begin, end, scores);
}

template <typename scalar_t, typename acc_t>
void backward_rows(const BackwardParams& p, int64_t begin, int64_t end, acc_t* widened) {
  BaselineEngine<acc_t>::template backward_rows<scalar_t, acc_t>(p, begin, end, widened);
}

#if defined(__GNUC__) && defined(__x86_64__)
#define SMS_AVX2 "avx2,fma,f16c"
#define SMS_AVX512 "avx512f,avx512bw,avx512dq,avx512vl,fma,f16c"

template <typename scalar_t, typename mask_t, typename acc_t>
[[gnu::target(SMS_AVX2)]] void forward_rows_avx2(const ForwardParams& p, int64_t begin, int64_t end,
                                                 acc_t* scores) {
  EngineFor<32, true, acc_t>::template forward_rows<scalar_t, mask_t>(p, begin, end, scores);
}

template <typename scalar_t, typename mask_t, typename acc_t>
[[gnu::target(SMS_AVX512)]] void forward_rows_avx512(const ForwardParams& p, int64_t begin, int64_t end,
                                                     acc_t* scores) {
  EngineFor<64, true, acc_t>::template forward_rows<scalar_t, mask_t>(p, begin, end, scores);
}

template <typename scalar_t, typename acc_t>
[[gnu::target(SMS_AVX2)]] void backward_rows_avx2(const BackwardParams& p, int64_t begin, int64_t end,
                                                  acc_t* widened) {
  EngineFor<32, true, acc_t>::template backward_rows<scalar_t, acc_t>(p, begin, end, widened);
}

template <typename scalar_t, typename acc_t>
[[gnu::target(SMS_AVX512)]] void backward_rows_avx512(const BackwardParams& p, int64_t begin, int64_t end,
                                                      acc_t* widened) {
  EngineFor<64, true, acc_t>::template backward_rows<scalar_t, acc_t>(p, begin, end, widened);
}
#endif

#if defined(__GNUC__) && defined(__x86_64__)
// The build of a kernel for the widest instruction set that torch's own CPU kernels take.
template <typename Kernel>
Kernel widest_build(Kernel baseline, Kernel avx2, Kernel avx512) {
  static const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") return avx512;
  if (capability == "AVX2") return avx2;
  return baseline;
}

// widest_build of `kernel` (with its builds kernel_avx2 and kernel_avx512) for the template arguments that follow.
#define SMS_WIDEST_BUILD(kernel, ...) \
  widest_build(kernel<__VA_ARGS__>, kernel##_avx2<__VA_ARGS__>, kernel##_avx512<__VA_ARGS__>)
#else
#define SMS_WIDEST_BUILD(kernel, ...) kernel<__VA_ARGS__>
#endif

// The build that runs, and the threads a call takes: one where this library was compiled without OpenMP, whatever
// torch.set_num_threads says (at::parallel_for then runs inline). `doctor` reports both.
std::tuple<std::string, int64_t> cpu_engine() {
#if defined(__GNUC__) && defined(__x86_64__)
  const std::string build = widest_build<const char*>("16-byte vectors", "AVX2", "AVX-512");
#elif defined(__GNUC__)
  const std::string build = "16-byte vectors";
#else
  const std::string build = "one lane";
#endif
#if defined(_OPENMP)
  const int64_t threads = at::get_num_threads();
#else
  const int64_t threads = 1;
#endif
  return {build, threads};
}

template <typename scalar_t, typename mask_t>
void forward_cpu(const ForwardParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto rows = SMS_WIDEST_BUILD(forward_rows, scalar_t, mask_t, acc_t);
  at::parallel_for(0, p.rows, rows_per_task(p.cols), [&](int64_t begin, int64_t end) {
    // Left uninitialised: the engine reads only what it wrote.
    const std::unique_ptr<acc_t[]> scores(new acc_t[cpu::row_room(p.cols)]);
    rows(p, begin, end, scores.get());
  });
}

template <typename scalar_t, typename acc_t>
void bias_grad_groups(const BackwardParams& p, int64_t begin, int64_t end, acc_t* widened, acc_t* sums) {
  BaselineEngine<acc_t>::template bias_grad_groups<scalar_t, acc_t>(p, begin, end, widened, sums);
}

#if defined(__GNUC__) && defined(__x86_64__)
template <typename scalar_t, typename acc_t>
[[gnu::target(SMS_AVX2)]] void bias_grad_groups_avx2(const BackwardParams& p, int64_t begin, int64_t end,
                                                     acc_t* widened, acc_t* sums) {
  EngineFor<32, true, acc_t>::template bias_grad_groups<scalar_t, acc_t>(p, begin, end, widened, sums);
}

template <typename scalar_t, typename acc_t>
[[gnu::target(SMS_AVX512)]] void bias_grad_groups_avx512(const BackwardParams& p, int64_t begin, int64_t end,
                                                         acc_t* widened, acc_t* sums) {
  EngineFor<64, true, acc_t>::template bias_grad_groups<scalar_t, acc_t>(p, begin, end, widened, sums);
}
#endif

// The buffer a task of the backward widens 16-bit rows into: none where y is in the compute type already.
template <typename scalar_t, typename acc_t>
std::unique_ptr<acc_t[]> widening_buffer(int64_t cols) {
  return std::unique_ptr<acc_t[]>(std::is_same_v<scalar_t, acc_t> ? nullptr : new acc_t[2 * cpu::row_room(cols)]);
}

template <typename scalar_t>
void backward_cpu(const BackwardParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto rows = SMS_WIDEST_BUILD(backward_rows, scalar_t, acc_t);
  at::parallel_for(0, p.rows, rows_per_task(p.cols), [&](int64_t begin, int64_t end) {
    rows(p, begin, end, widening_buffer<scalar_t, acc_t>(p.cols).get());
  });
}

// Each group (BackwardParams) sums its part of a bias row's rows, one after another: parts enough for every thread
// to have several groups whatever the bias rows.
template <typename scalar_t>
void backward_with_bias_grad_cpu(const BackwardParams& p) {
  using acc_t = at::opmath_type<scalar_t>;
  const auto groups = SMS_WIDEST_BUILD(bias_grad_groups, scalar_t, acc_t);
  const int64_t grain = std::max<int64_t>(1, rows_per_task(p.cols) / p.rows_per_part);
  at::parallel_for(0, p.bias_grad_rows, grain, [&](int64_t begin, int64_t end) {
    const std::unique_ptr<acc_t[]> sums(new acc_t[cpu::row_room(p.cols)]);
    groups(p, begin, end, widening_buffer<scalar_t, acc_t>(p.cols).get(), sums.get());
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

// Parts of each bias row's rows: four groups a thread, where there are that many rows.
constexpr int64_t kGroupsPerThread = 4;

std::tuple<at::Tensor, at::Tensor> backward_with_bias_grad_cpu_op(const at::Tensor& y, const at::Tensor& dy,
                                                                  double scale, bool is_causal,
                                                                  c10::string_view causal_variant, int64_t bias_rows) {
  BackwardParams p;
  BackwardOperands operands = make_backward_params(
      y, dy, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  check_bias_rows(bias_rows, p);
  if (p.rows == 0) return {operands.dx, zero_bias_grad(y, bias_rows, p)};
  const at::Tensor sums = make_bias_grad_parts(y, bias_rows, kGroupsPerThread * at::get_num_threads(), p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "scaled_mask_softmax_backward",
                                  [&] { backward_with_bias_grad_cpu<scalar_t>(p); });
  return {operands.dx, bias_grad_of_parts(sums)};
}

}  // namespace

TORCH_LIBRARY(scaled_mask_softmax, m) {
  m.def("forward(Tensor x, Tensor? mask, float scale, bool is_causal, str causal_variant) -> Tensor");
  // The backward of forward with the same scale and causal limit: hidden keys are not read, their gradient is 0.
  m.def(
      "backward(Tensor y, Tensor dy, float scale, bool is_causal=False, str causal_variant=\"upper_left\") -> Tensor");
  // The backward, where x's scores took a learnable bias broadcast over leading dims (row r of y took its row
  // r % bias_rows): dx, and the bias's gradient [bias_rows, Sk], the score gradients y * (dy - sum(dy * y)) of the
  // rows that took each bias row summed in y's compute type (fp32, fp64 for fp64).
  m.def(
      "backward_with_bias_grad(Tensor y, Tensor dy, float scale, bool is_causal, str causal_variant, "
      "SymInt bias_rows) -> (Tensor dx, Tensor bias_grad)");
  m.def("cpu_engine() -> (str build, int threads)", &cpu_engine);
}

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CPU, m) {
  m.impl("forward", &forward_cpu_op);
  m.impl("backward", &backward_cpu_op);
  m.impl("backward_with_bias_grad", &backward_with_bias_grad_cpu_op);
}

}  // namespace sms
