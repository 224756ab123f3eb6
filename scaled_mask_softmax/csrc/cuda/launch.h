// How rows are spread over threads: one ladder by row length, shared by the forward and backward passes.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sms {

constexpr int kWarp = 32;
// Per-thread vectors of a row held in registers: 1, 2, 4 or 8.
constexpr int kMaxIters = 8;
// Blocks of the short-row tier: four warps, each split into groups of lanes, one group per row.
constexpr int kShortRowThreads = 128;
// Rows too long for registers: one block per row; 512 threads leave each room for kUnroll vectors of two operands.
constexpr int kLongRowThreads = 512;
// Vectors each thread of the two-pass kernels loads before using any.
constexpr int kUnroll = 4;
// Vectors each thread of the register kernels aims to hold: 64 bytes of bf16 in flight per thread, and the
// per-row work (finding where the row starts, the reductions) shared by enough elements.
constexpr int kTargetIters = 4;

// Rows longer than one block holds: up to this many blocks of a thread-block cluster per row (the portable most;
// 16 measured slower than two passes).
constexpr int kMaxClusterBlocks = 8;

// Threads per block that still leave a thread `data_registers` for its part of the row plus room for addresses,
// 64-bit row arithmetic and exp, so that nothing spills (65,536 registers per multiprocessor).
constexpr int max_threads_for(int data_registers) {
  return data_registers <= 32 ? 512 : data_registers <= 64 ? 256 : 128;
}

// Registers one vector of VEC elements of type T costs a thread that holds `operands` such vectors; fp64 counts
// double again, for the registers its exp and division take.
template <typename T>
constexpr int registers_for(int vec, int operands) {
  return operands * vec * static_cast<int>(sizeof(T)) / 4 * (sizeof(T) == 8 ? 2 : 1);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// How the threads of a register kernel cover rows.
struct RowTiling {
  int width;           // threads per row: a power of two up to 32, or the whole block
  int blocks_per_row;  // 1, or the blocks of one cluster that share a row, each holding a slice of it
};

struct RowPlan {
  bool in_registers;  // false: the two-pass kernel, one block per row
  int iters;          // vectors per thread
  int threads;        // threads per block
  RowTiling tiling;
};

constexpr RowPlan kTwoPass = {false, 1, kLongRowThreads, {kLongRowThreads, 1}};

// Where a thread's part of a row lies: the rows its group takes, and the column of each of its vectors. Blocks
// that share a row (the ranks of a cluster) hold consecutive slices of it.
struct RowCover {
  int64_t first_row_;
  int64_t row_step_;
  int64_t slice_start_;
  int width_;
  int lane_;

  __device__ RowCover(const RowTiling& tiling, int elements_per_thread)
      : width_(tiling.width), lane_(threadIdx.x % tiling.width) {
    const int rows_per_block = blockDim.x / tiling.width;
    first_row_ = static_cast<int64_t>(blockIdx.x / tiling.blocks_per_row) * rows_per_block + threadIdx.x / tiling.width;
    row_step_ = static_cast<int64_t>(gridDim.x / tiling.blocks_per_row) * rows_per_block;
    slice_start_ = static_cast<int64_t>(blockIdx.x % tiling.blocks_per_row) * tiling.width * elements_per_thread;
  }

  __device__ __forceinline__ int64_t first_row() const { return first_row_; }
  __device__ __forceinline__ int64_t row_step() const { return row_step_; }
  // The first column of the thread's i-th vector of `vec` elements.
  __device__ __forceinline__ int64_t column(int i, int vec) const {
    return slice_start_ + (static_cast<int64_t>(i) * width_ + lane_) * vec;
  }
};

// Rows that one block (or a group of lanes) holds in registers, kTargetIters vectors per thread where the row
// allows; `registers_per_vector`: what one vector of the row costs a thread (all operands it holds).
inline RowPlan plan_block(int64_t cols, int vec, int registers_per_vector) {
  const int64_t vectors = ceil_div(cols, vec);
  if (vectors <= kWarp * kTargetIters) {
    // Short rows: a group of lanes per row, so that a warp may hold many rows.
    const int width = next_power_of_two(std::min<int64_t>(ceil_div(vectors, kTargetIters), kWarp));
    return {true, next_power_of_two(ceil_div(vectors, width)), kShortRowThreads, {width, 1}};
  }
  for (int iters = kTargetIters; iters <= kMaxIters; iters *= 2) {
    const int threads = static_cast<int>(ceil_div(ceil_div(vectors, iters), kWarp) * kWarp);
    if (threads <= max_threads_for(iters * registers_per_vector)) return {true, iters, threads, {threads, 1}};
  }
  return kTwoPass;
}

// Rows beyond one block's registers: split over the fewest blocks of a cluster (at most `cluster_blocks`) whose
// slices each fit one block; `in_registers` is false when even that cannot hold the row.
inline RowPlan plan_cluster(int64_t cols, int vec, int registers_per_vector, int cluster_blocks) {
  for (int blocks = 2; blocks <= cluster_blocks; blocks *= 2) {
    RowPlan slice = plan_block(ceil_div(cols, blocks), vec, registers_per_vector);
    if (slice.in_registers && slice.tiling.width == slice.threads) {
      slice.tiling.blocks_per_row = blocks;
      return slice;
    }
  }
  return kTwoPass;
}

// Grids stride over rows; this cap only guards the launch limit.
constexpr int64_t kMaxBlocks = 1 << 30;

inline unsigned blocks_for(int64_t rows, const RowPlan& plan) {
  const int rows_per_block = plan.threads / plan.tiling.width;
  const int64_t groups = std::min(ceil_div(rows, rows_per_block), kMaxBlocks / plan.tiling.blocks_per_row);
  return static_cast<unsigned>(groups * plan.tiling.blocks_per_row);
}

// The most blocks a cluster may have for `kernel`: kMaxClusterBlocks where it runs sm_90 code, else 1.
template <typename Kernel>
int cluster_blocks_for(Kernel kernel) {
  cudaFuncAttributes attributes;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return attributes.binaryVersion >= 90 ? kMaxClusterBlocks : 1;
}

// kernel<<<blocks, threads, 0, stream>>>(args...) in clusters of `cluster_blocks` blocks. False, launching
// nothing, when the device cannot hold one such cluster.
template <typename... Params, typename... Args>
bool launch_in_clusters(void (*kernel)(Params...), unsigned blocks, int threads, int cluster_blocks,
                        cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster_blocks;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int resident_clusters = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&resident_clusters, kernel, &config));
  if (resident_clusters == 0) return false;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  return true;
}

// Calls body(std::integral_constant<int, iters>{}) for iters in 1, 2, 4, 8.
template <typename Body>
void with_iters(int iters, Body&& body) {
  switch (iters) {
    case 1: return body(std::integral_constant<int, 1>{});
    case 2: return body(std::integral_constant<int, 2>{});
    case 4: return body(std::integral_constant<int, 4>{});
    default: return body(std::integral_constant<int, 8>{});
  }
}

}  // namespace sms
