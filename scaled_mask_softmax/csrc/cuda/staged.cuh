// Rows brought into shared memory by the copy engine (sm_90 bulk copies) ahead of the block that works on them:
// the persistent loop of the staged kernels, and their launch.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "async_copy.cuh"
#include "launch.h"

namespace sms {

// Rows a block of a staged kernel keeps on their way at once: the one it works on and the next.
constexpr int kStagedRows = 2;

// Where the register kernel fits at most this many blocks a multiprocessor, and so has at most that many rows on
// their way at once, the staged kernel takes its rows. Forward, 16-bit rows of 16,384 columns (two blocks) measured
// 1.171 -> 1.135 of the floor, fp32 (one) 1.173 -> 1.094; rows of 4096 columns in eight blocks of 128 threads,
// 1.063 -> 1.184, and of 1024 in one- and two-warp blocks, 1.020 -> 1.153 (benchmarks/NOTES.md, v22).
constexpr int kStagedMaxBlocks = 2;

SMS_HOST_DEVICE int64_t round_up(int64_t n, int64_t multiple) { return ceil_div(n, multiple) * multiple; }

// The bytes of `count` elements of `bytes_each` bytes, rounded up to whole 16-byte words: what a bulk copy moves.
SMS_HOST_DEVICE uint32_t copy_bytes(int64_t count, int bytes_each) {
  return static_cast<uint32_t>(round_up(count * bytes_each, 16));
}

// A stage holds a row of two operands: the first from the stage's start, the second from the first 128-byte
// boundary after it. Elements of `first_size` and `second_size` bytes (0: no such operand).
SMS_HOST_DEVICE int64_t second_operand_offset(int64_t cols, int first_size) { return round_up(cols * first_size, 128); }

SMS_HOST_DEVICE int64_t stage_bytes_for(int64_t cols, int first_size, int second_size) {
  return second_operand_offset(cols, first_size) + round_up(cols * second_size, 128);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Run by one thread: the bulk copies of a row's two operands (either may have 0 bytes), counted on `barrier`.
__device__ __forceinline__ void bring_pair(uint64_t* barrier, void* first_stage, const void* first,
                                           uint32_t first_bytes, void* second_stage, const void* second,
                                           uint32_t second_bytes) {
  barrier_arrive_expecting(barrier, first_bytes + second_bytes);
  if (first_bytes > 0) bulk_copy_to_shared(first_stage, first, first_bytes, barrier);
  if (second_bytes > 0) bulk_copy_to_shared(second_stage, second, second_bytes, barrier);
}

// Calls body(visit, stage) for the rows a block of a persistent grid takes (first, first + step, ... before `rows`),
// each in `stage`, `stage_bytes` of the block's dynamic shared memory, once bring(visit, stage, barrier) has landed
// there: one thread runs it, kStagedRows rows ahead, and it issues the bulk copies of row `visit` (bring_pair). A
// row after the next is sent for once every thread is done with the stage: after body, at a barrier.
template <typename Bring, typename Body>
__device__ __forceinline__ void for_each_staged_row(int64_t first, int64_t step, int64_t rows, int64_t stage_bytes,
                                                    Bring&& bring, Body&& body) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[kStagedRows];
  const bool leader = threadIdx.x == 0;
  const auto bring_into = [&](int64_t visit, int stage) {
    if (leader && visit < rows) bring(visit, stages + stage * stage_bytes, &landed[stage]);
  };
  if (leader) {
    for (int stage = 0; stage < kStagedRows; ++stage) barrier_init(&landed[stage], 1);
    barrier_init_fence();
  }
  __syncthreads();
  for (int stage = 0; stage < kStagedRows; ++stage) bring_into(first + stage * step, stage);
  int k = 0;
  for (int64_t visit = first; visit < rows; visit += step, ++k) {
    const int stage = k % kStagedRows;
    barrier_wait(&landed[stage], (k / kStagedRows) & 1);
    body(visit, stages + stage * stage_bytes);
    // Sent for here rather than once the row is in registers, where the copy's arithmetic spilled (ptxas, sm_90,
    // at 64 registers).
    __syncthreads();
    bring_into(visit + kStagedRows * step, stage);
  }
}

#endif

// Launches kernel(p), a staged kernel of `threads` threads a block and `stage_bytes` of shared memory a row, in a
// persistent grid, where register_kernel, the kernel that would take the rows otherwise, fits at most
// `max_register_blocks` blocks a multiprocessor, the device runs kernel's sm_90 code, and kernel's shared memory
// leaves a multiprocessor as many blocks as register_kernel's registers do; false otherwise.
template <typename Params, typename... Args>
bool launch_staged(void (*kernel)(Params), void (*register_kernel)(Params, Args...), const Params& p, int threads,
                   int64_t stage_bytes, cudaStream_t stream, int max_register_blocks = kStagedMaxBlocks) {
  int register_blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&register_blocks, register_kernel, threads, 0));
  if (register_blocks > max_register_blocks) return false;
  cudaFuncAttributes attributes;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int64_t bytes = kStagedRows * stage_bytes;
  if (attributes.binaryVersion < 90 || bytes > device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) {
    return false;
  }
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int staged_blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&staged_blocks, kernel, threads, bytes));
  if (staged_blocks < register_blocks) return false;
  const int64_t resident = int64_t{staged_blocks} * device_attribute(cudaDevAttrMultiProcessorCount);
  kernel<<<static_cast<unsigned>(std::min(p.rows, resident)), threads, bytes, stream>>>(p);
  return true;
}

}  // namespace sms
