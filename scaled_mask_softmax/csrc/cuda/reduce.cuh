// Reductions over the threads that share a row: a group of up to 32 lanes of one warp, a whole block, or the
// blocks of a cluster.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

namespace sms {

// A NaN may lose here, but every score also passes through the sum of exponentials, which it turns to NaN:
// a row holding NaN still comes out NaN, as in torch.softmax.
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return fmax(a, b);
  }
};

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

// The lanes of this thread's group of `width` (a power of two <= 32) within its warp.
__device__ __forceinline__ unsigned group_lanes(int width) {
  if (width == 32) return 0xffffffffu;
  const int first = (threadIdx.x % 32) / width * width;
  return ((1u << width) - 1u) << first;
}

// `value` (the same in every thread of the block) reduced over the `blocks` blocks of this block's cluster,
// through distributed shared memory. Every block combines the values in rank order, so all get the same result.
template <typename T, typename Op>
__device__ __forceinline__ T cluster_reduce(T value, Op op, T* slot, int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) *slot = value;
  cluster.sync();
  T result = *cluster.map_shared_rank(slot, 0);
  for (int rank = 1; rank < blocks; ++rank) result = op(result, *cluster.map_shared_rank(slot, rank));
  // No block may overwrite its slot, or exit, before every block has read it.
  cluster.sync();
  return result;
#else
  // Clusters need sm_90; the launch never asks for one elsewhere.
  return value;
#endif
}

// Every thread of the row's group gets the reduction of `value`. Groups wider than a warp are whole blocks,
// which go through `shared` (32 slots) and must all call this together.
template <typename T, typename Op>
__device__ __forceinline__ T row_reduce(T value, Op op, T identity, int width, T* shared) {
  const unsigned lanes = group_lanes(width < 32 ? width : 32);
  for (int offset = (width < 32 ? width : 32) / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(lanes, value, offset, 32));
  }
  if (width <= 32) return value;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : identity;
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset, 32));
  // The slots are reused by the next reduction: nobody may overwrite them before everyone has read.
  __syncthreads();
  return value;
}

}  // namespace sms
