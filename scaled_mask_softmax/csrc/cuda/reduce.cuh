// Reductions over the threads that share a row: a group of up to 32 lanes of one warp, a whole block, or the
// blocks of a cluster.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "async_copy.cuh"

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

// Every lane of a whole warp gets the reduction of `value` over the warp.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset, 32));
  return value;
}

// The blocks of a cluster (sm_90) that share a row combine one value a row: each block sends its value into a
// slot of every block's shared memory (st.async, which counts the bytes on the receiver's mbarrier) and combines
// the slots in rank order once all have arrived, so every block gets the same result. A cluster barrier would do
// it too, but its memory fence waits for all of the block's outstanding stores of y every row. Two sets of slots
// alternate: a block may send the next row's value while another still reads this row's. Lives in shared memory;
// every thread of every block of the cluster calls each member, the same number of times.
template <typename T, int kMaxRanks>
struct alignas(16) ClusterExchange {  // slots of 16 bytes are sent by one 16-byte st.async
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16, "sent as one st.async");
  uint64_t arrived[2];
  T slots[2][kMaxRanks];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static __device__ __forceinline__ void cluster_barrier() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
  }
#endif

  // Before the first exchange: no block may send before every block has set up its barriers.
  __device__ __forceinline__ void start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      for (int i = 0; i < 2; ++i) barrier_init(&arrived[i], 1);
      barrier_init_fence();
    }
    cluster_barrier();
#endif
  }

  // `value` (the same in every thread of the block) combined over the `blocks` blocks by `op`; `round` counts the
  // exchanges from 0.
  template <typename Op>
  __device__ __forceinline__ T reduce(const T& value, Op op, int blocks, int round) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int set = round & 1;
    uint32_t rank;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    if (threadIdx.x == 0) barrier_arrive_expecting(&arrived[set], static_cast<uint32_t>(blocks * sizeof(T)));
    if (threadIdx.x < blocks) {
      const uint32_t slot = in_cluster_block(&slots[set][rank], threadIdx.x);
      const uint32_t barrier = in_cluster_block(&arrived[set], threadIdx.x);
      uint32_t words[sizeof(T) / 4];
      memcpy(words, &value, sizeof(T));
      if constexpr (sizeof(T) == 4) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(slot),
                     "r"(words[0]), "r"(barrier)
                     : "memory");
      } else if constexpr (sizeof(T) == 8) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(slot),
                     "r"(words[0]), "r"(words[1]), "r"(barrier)
                     : "memory");
      } else {
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(slot),
            "r"(words[0]), "r"(words[1]), "r"(words[2]), "r"(words[3]), "r"(barrier)
            : "memory");
      }
    }
    barrier_wait(&arrived[set], (round >> 1) & 1);
    T result = slots[set][0];
    for (int b = 1; b < blocks; ++b) result = op(result, slots[set][b]);
    return result;
#else
    // Clusters need sm_90; the launch never asks for one elsewhere.
    return value;
#endif
  }

  // After the last exchange: no block may exit while another may still send to it.
  __device__ __forceinline__ void finish() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cluster_barrier();
#endif
  }
};

// Every thread of the row's group gets the reduction of `value`. Every lane of a warp calls this together, groups
// of fewer than 32 lanes too (their kernels take rows warp by warp, warp_has_row); groups wider than a warp
// are whole blocks, which go through `shared` (32 slots) and must all call this together. The shuffles take every
// lane of the warp, unrolled: with a group's lanes as the mask (a value known only at run time), each step took a
// convergence check (MATCH, REDUX, VOTE) besides, about 40 instructions a warp a reduction more (SASS, sm_90).
template <typename T, typename Op>
__device__ __forceinline__ T row_reduce(T value, Op op, T identity, int width, T* shared) {
  if (width < 32) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      if (offset < width) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset, 32));
    }
    return value;
  }
  value = warp_reduce(value, op);
  if (width == 32) return value;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = warp_reduce(lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : identity, op);
  // The slots are reused by the next reduction: nobody may overwrite them before everyone has read.
  __syncthreads();
  return value;
}

}  // namespace sms
