// The forward pass on CUDA: tensors -> params, dtype and mask dispatch, the ladder by row length.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../binding.h"
#include "alignment.h"
#include "forward.cuh"

namespace sms {
namespace {

// forward_streamed where it measured faster (benchmarks/NOTES.md, v7: rows with a bool mask, and rows with a
// floating mask that take four warps or more; rows without a mask, with a floating mask on fewer warps, or with a
// causal limit came out as fast or faster from registers), where the device runs its sm_90 code and where every
// row of x and the mask may be bulk-copied (16-byte aligned, a multiple of 16 bytes); false otherwise. Rows of a
// few vectors a thread and fp64 rows were not measured, and stay in the register kernels.
template <typename scalar_t, typename mask_t, int VEC, int ITERS>
bool launch_streamed(const ForwardParams& p, const RowPlan& plan, cudaStream_t stream) {
  if constexpr (!has_mask_v<mask_t> || VEC * sizeof(scalar_t) != 16 || sizeof(scalar_t) > 4 ||
                ITERS < kTargetIters) {
    return false;
  } else {
    constexpr int kMaskVec = 16 / sizeof(mask_t);
    if (p.is_causal || (!std::is_same_v<mask_t, bool> && plan.width < 4 * kWarp)) return false;
    if (p.cols % kMaskVec != 0 || !rows_aligned(p.mask, p.mask_strides, p.shape, kMaskVec, sizeof(mask_t))) {
      return false;
    }
    const RingLayout layout(p.cols, sizeof(scalar_t), sizeof(mask_t), plan.width, plan.threads);
    auto* kernel = forward_streamed<scalar_t, mask_t, VEC, ITERS>;
    const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), plan.threads, layout.bytes());
    if (resident == 0) return false;
    const int64_t tiles = ceil_div(p.rows, layout.rows_per_tile);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(tiles, layout.groups), resident));
    kernel<<<blocks, plan.threads, layout.bytes(), stream>>>(p, plan.width);
    return true;
  }
}

template <typename scalar_t, typename mask_t, int VEC>
void forward_ladder(const ForwardParams& p, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const RowPlan plan = plan_block(p.cols, VEC, registers_for<acc_t>(VEC, 1));
  if (!plan.in_registers) {
    launch_two_pass(forward_two_pass<scalar_t, mask_t, VEC>, p, VEC, stream);
    return;
  }
  with_iters(plan.iters, [&](auto iters) {
    constexpr int kIters = decltype(iters)::value;
    if (launch_streamed<scalar_t, mask_t, VEC, kIters>(p, plan, stream)) return;
    const unsigned blocks = blocks_for(p.rows, plan);
    if (p.is_causal) {
      forward_in_registers<scalar_t, mask_t, VEC, kIters, true><<<blocks, plan.threads, 0, stream>>>(p, plan.width);
    } else {
      forward_in_registers<scalar_t, mask_t, VEC, kIters, false><<<blocks, plan.threads, 0, stream>>>(p, plan.width);
    }
  });
}

template <typename scalar_t, typename mask_t>
void launch_forward(const ForwardParams& p, cudaStream_t stream) {
  // 16-byte vectors when every row of x, mask and y starts aligned; element by element otherwise.
  constexpr int kVec = 16 / sizeof(scalar_t);
  int mask_bytes = 1;
  if constexpr (has_mask_v<mask_t>) mask_bytes = sizeof(mask_t);
  const bool aligned = p.cols % kVec == 0 &&
                       rows_aligned(p.x, p.x_strides, p.shape, kVec, sizeof(scalar_t)) &&
                       rows_aligned(p.y, contiguous_row_strides(p.shape, p.cols), p.shape, kVec, sizeof(scalar_t)) &&
                       (p.mask == nullptr || rows_aligned(p.mask, p.mask_strides, p.shape, kVec, mask_bytes));
  if (aligned) {
    forward_ladder<scalar_t, mask_t, kVec>(p, stream);
  } else {
    forward_ladder<scalar_t, mask_t, 1>(p, stream);
  }
}

at::Tensor forward_cuda(const at::Tensor& x, const std::optional<at::Tensor>& mask, double scale, bool is_causal,
                        c10::string_view causal_variant) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  ForwardParams p;
  ForwardOperands operands = make_forward_params(
      x, mask, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.y;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scaled_mask_softmax_forward", [&] {
    dispatch_mask<scalar_t>(operands.mask_kind, [&](auto mask_tag) {
      launch_forward<scalar_t, typename decltype(mask_tag)::type>(p, stream);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return operands.y;
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CUDA, m) { m.impl("forward", &forward_cuda); }

}  // namespace sms
