// The forward pass on CUDA: tensors -> params, the dtype dispatch (the launches: forward_ladder.cuh).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <numeric>

#include "../binding.h"
#include "alignment.h"
#include "forward_launch.h"
#include "launch.h"

namespace sms {
namespace {

// Bytes of the distinct elements of `t`: a dim of stride 0 (broadcast) counts once.
int64_t distinct_bytes(const at::Tensor& t) {
  int64_t elements = 1;
  for (int64_t d = 0; d < t.dim(); ++d) elements *= t.stride(d) == 0 ? 1 : t.size(d);
  return elements * t.element_size();
}

// The order in which the kernels take rows. Where the mask's rows repeat over the outermost dim but differ within
// it (a bias, not a padding mask broadcast over everything), each mask row's repeats are taken together; but only
// where the mask and what streams through the L2 between two repeats of a mask row (x and y of one outer index, of
// `element_size` bytes an element) exceed a quarter of the L2: the reordered rows lose their neighbours in memory,
// which rows of 128 columns measured slower (benchmarks/NOTES.md, v9), and a bias of fp32 rows of 512 columns
// (16 + 32 MB) measured as if read from memory every time in the batch's order (v27).
RowOrder row_order(const ForwardParams& p, const at::Tensor& mask, int64_t element_size) {
  if (p.mask == nullptr || p.shape.dims < 2 || p.mask_strides.stride[0] != 0 || p.shape.size[0].value < 2) {
    return {};
  }
  bool varies_within = false;
  for (int d = 1; d < p.shape.dims; ++d) varies_within = varies_within || p.mask_strides.stride[d] != 0;
  const int64_t rows_within = p.rows / p.shape.size[0].value;
  const int64_t streamed_bytes = 2 * rows_within * p.cols * element_size;
  if (!varies_within || distinct_bytes(mask) + streamed_bytes < l2_bytes() / 4) return {};
  return {p.shape.size[0], rows_within};
}

// Writes the `span` elements at `source` over and over into `copy`'s first `total`, a 16-byte vector a thread. The
// copies after the first start mid-vector, and at::Tensor::copy_ from a broadcast source loads and stores each element
// alone: 3.6 us for two batches of 12 heads of 197x197 bf16 on an H100 (benchmarks/NOTES.md, v130).
constexpr int kRepeatThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRepeatThreads) repeat_span(const T* source, int64_t span, T* copy, int64_t total) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kRepeatThreads + threadIdx.x) * kVec;
  if (first >= total) return;
  union {
    uint4 bits;
    T element[kVec];
  } vector;
  int64_t from = first % span;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    vector.element[i] = source[from];
    from = from + 1 == span ? 0 : from + 1;
  }
  if (first + kVec <= total) {
    *reinterpret_cast<uint4*>(copy + first) = vector.bits;
    return;
  }
  // Unrolled, so that each element is a register: indexed at run time, the vector went to a stack frame.
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (first + i < total) copy[first + i] = vector.element[i];
  }
}

template <typename T>
void launch_repeat_span(const void* source, int64_t span, void* copy, int64_t total, cudaStream_t stream) {
  const int64_t vectors = ceil_div(total, 16 / static_cast<int64_t>(sizeof(T)));
  repeat_span<<<static_cast<unsigned>(ceil_div(vectors, kRepeatThreads)), kRepeatThreads, 0, stream>>>(
      static_cast<const T*>(source), span, static_cast<T*>(copy), total);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A mask that repeats over the outermost dim and lies within it as x does (a bias [1, H, Sq, Sk] of x [B, H, Sq, Sk])
// starts each row as far into its vectors as x's only in the batches that start a whole number of vectors into x: at
// 12 heads of 197 bf16 queries (H * Sq * Sk = 4 mod 8), every other one, and in the others the shifted kernels join
// two vectors of it for each one they use. Where it is small beside x, it is written out over the fewest batches that
// span whole vectors, and the outermost dim taken as [B / repeats, repeats]: then every mask row starts as x's does.
// Not where those are two and the mask floating: its rows then start as x's or half a vector further, and the
// shifted kernels read it as half vectors (launch_shifted). Returns the copy, to be kept until the launch, or an
// undefined tensor where the mask stays as it is.
at::Tensor repeat_mask_alike(ForwardParams& p, const at::Tensor& x, const at::Tensor& mask, cudaStream_t stream) {
  const int64_t vec = 16 / x.element_size();
  if (x.element_size() > 4 || p.mask == nullptr || p.shape.dims + 1 > kMaxOuterDims || p.mask_strides.stride[0] != 0 ||
      p.cols % vec == 0 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0) {
    return {};
  }
  const int64_t batch_stride = p.x_strides.stride[0];
  const int64_t batches = p.shape.size[0].value;
  const int64_t repeats = vec / std::gcd(batch_stride, vec);
  if (repeats == 1 || batches % repeats != 0) return {};
  if (repeats == 2 && mask.scalar_type() != at::kBool &&
      mask_rows_in_half_vectors(p, static_cast<int>(x.element_size()), static_cast<int>(mask.element_size()),
                                static_cast<int>(vec))) {
    return {};
  }
  // Within a batch: the mask's strides are x's, and its rows fill the batch's stride with no gap between them, so
  // that the mask is the batch_stride elements from its first on, in x's order.
  int64_t elements = p.cols;
  for (int d = 1; d < p.shape.dims; ++d) {
    if (p.shape.size[d].value == 1) continue;
    if (p.mask_strides.stride[d] != p.x_strides.stride[d]) return {};
    elements *= p.shape.size[d].value;
  }
  RowShape within = p.shape;
  RowStrides within_strides = p.x_strides;
  within.size[0] = Divisor(1);
  if (elements != batch_stride || rows_extent(within, within_strides, p.cols) != batch_stride) return {};
  // Written out at most an eighth of x's bytes.
  if (8 * repeats * batch_stride * mask.element_size() > p.rows * p.cols * x.element_size()) return {};
  at::Tensor copy = at::empty({repeats * batch_stride}, mask.options());
  switch (mask.element_size()) {
    case 1: launch_repeat_span<uint8_t>(p.mask, batch_stride, copy.data_ptr(), copy.numel(), stream); break;
    case 2: launch_repeat_span<uint16_t>(p.mask, batch_stride, copy.data_ptr(), copy.numel(), stream); break;
    case 4: launch_repeat_span<uint32_t>(p.mask, batch_stride, copy.data_ptr(), copy.numel(), stream); break;
    default: return {};
  }
  RowShape shape;
  RowStrides x_strides{}, mask_strides{};
  shape.dims = p.shape.dims + 1;
  shape.size[0] = Divisor(batches / repeats);
  shape.size[1] = Divisor(repeats);
  x_strides.stride[0] = repeats * batch_stride;
  x_strides.stride[1] = batch_stride;
  mask_strides.stride[1] = batch_stride;
  for (int d = 1; d < p.shape.dims; ++d) {
    shape.size[d + 1] = p.shape.size[d];
    x_strides.stride[d + 1] = p.x_strides.stride[d];
    mask_strides.stride[d + 1] = p.mask_strides.stride[d];
  }
  p.shape = shape;
  p.x_strides = x_strides;
  p.mask_strides = mask_strides;
  p.mask = copy.data_ptr();
  p.mask_end = static_cast<const char*>(p.mask) + copy.numel() * copy.element_size();
  return copy;
}

at::Tensor forward_cuda(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool is_causal,
                        c10::string_view causal_variant) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  ForwardParams p;
  ForwardOperands operands = make_forward_params(
      x, mask, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.y;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor mask_copy = repeat_mask_alike(p, x, operands.mask, stream);
  p.order = row_order(p, mask_copy.defined() ? mask_copy : operands.mask, x.element_size());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scaled_mask_softmax_forward", [&] {
    launch_forward<scalar_t>(p, operands.mask_kind, stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return operands.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CUDA, m) { m.impl("forward", &forward_cuda); }

}  // namespace sms
