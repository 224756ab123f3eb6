// The forward pass on CUDA: tensors -> params, the dtype dispatch (the launches: forward_ladder.cuh).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../binding.h"
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

at::Tensor forward_cuda(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool is_causal,
                        c10::string_view causal_variant) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  ForwardParams p;
  ForwardOperands operands = make_forward_params(
      x, mask, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.y;
  p.order = row_order(p, operands.mask, x.element_size());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scaled_mask_softmax_forward", [&] {
    launch_forward<scalar_t>(p, operands.mask_kind, stream);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return operands.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CUDA, m) { m.impl("forward", &forward_cuda); }

}  // namespace sms
