// How rows are spread over threads: one ladder by row length, shared by the forward and backward passes.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/FunctionRef.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "../params.h"
#include "reduce.cuh"

namespace sms {

constexpr int kWarp = 32;
// Per-thread vectors of a row held in registers: 1, 2, 4 or 8.
constexpr int kMaxIters = 8;
// Blocks of the short-row tier: one warp, split into groups of lanes, one group per row. A block's slot is freed
// only when its last warp ends, so one-warp blocks leave no slot held by a warp that is done (16-bit rows of 128-1024
// columns up to 2.4% faster than four warps; benchmarks/NOTES.md, v14.1). A multiprocessor then holds 32 warps, the
// most that 64 registers a thread allow anyway.
constexpr int kShortRowThreads = 32;
// Rows too long for registers: blocks of the two-pass kernels, each taking a slice of a row.
constexpr int kLongRowThreads = 256;
// Vectors each thread of the two-pass kernels loads before using any (but causal 16-bit rows: kTwoPassShape).
constexpr int kUnroll = 4;
// The most unrolled sweeps of a block over its slice of a row, in each pass.
constexpr int kSweepsPerSlice = 4;
// Vectors each thread of the register kernels aims to hold: 64 bytes of bf16 in flight per thread, and the
// per-row work (finding where the row starts, the reductions) shared by enough elements.
constexpr int kTargetIters = 4;

// Rows longer than one block holds: up to this many blocks of a thread-block cluster per row.
constexpr int kMaxClusterBlocks = 16;

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

// __launch_bounds__'s minimum blocks a multiprocessor for a kernel of `threads` threads a block: where
// `in_64_registers`, the blocks that fit at 64 registers a thread, which holds the kernel to 64; otherwise 1.
constexpr int min_blocks_for(bool in_64_registers, int threads) {
  return in_64_registers ? 65536 / (64 * threads) : 1;
}

SMS_HOST_DEVICE int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
SMS_HOST_DEVICE int64_t round_up(int64_t n, int64_t multiple) { return ceil_div(n, multiple) * multiple; }

inline int next_power_of_two(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

struct RowPlan {
  bool in_registers;  // false: the two-pass kernels
  int iters;          // vectors per thread
  int threads;        // threads per block
  int width;          // threads per row: a power of two up to 32, or the whole block
};

// Where a thread of a register kernel finds its part of a row: the rows its group of `width` threads takes, and
// the column of each of its vectors.
struct RowCover {
  int64_t first_row_;
  int row_step_;  // within 32 bits (blocks_for): one register less across the row loop
  int width_;
  int lane_;

  // `width`: a power of two up to kWarp (groups of lanes) or the whole block (RowPlan), so that shifts find a
  // thread's group where a division by a run-time width took a reciprocal and a dozen instructions before the first
  // load of every block.
  __device__ explicit RowCover(int width) : width_(width) {
    const bool groups = width <= kWarp;
    const int shift = __ffs(width) - 1;
    const int group = groups ? static_cast<int>(threadIdx.x) >> shift : 0;
    const int rows_per_block = groups ? static_cast<int>(blockDim.x) >> shift : 1;
    lane_ = groups ? static_cast<int>(threadIdx.x) & (width - 1) : static_cast<int>(threadIdx.x);
    first_row_ = static_cast<int64_t>(blockIdx.x) * rows_per_block + group;
    row_step_ = static_cast<int>(gridDim.x) * rows_per_block;
  }

  __device__ __forceinline__ int64_t first_row() const { return first_row_; }
  __device__ __forceinline__ int row_step() const { return row_step_; }
  // The first column of the thread's i-th vector of `vec` elements (rows in registers are far shorter than 2^31).
  __device__ __forceinline__ int column(int i, int vec) const { return (i * width_ + lane_) * vec; }
  __device__ __forceinline__ int lane() const { return lane_; }
  __device__ __forceinline__ int width() const { return width_; }
};

// Whether any lane of the warp has a row (`has_row`, its own): where groups of lanes share a warp, they go round
// their rows together as long as one of them has a row, so that their reductions shuffle over the whole warp
// (row_reduce); a group past the last row then takes the last row again and stores nothing. The groups' first row
// held in a register instead spilled 16-20 bytes at 64 registers (ptxas, sm_90, causal 16-bit rows with a mask).
__device__ __forceinline__ bool warp_has_row(bool has_row) { return __any_sync(0xffffffffu, has_row); }

// Columns of each slice but the last where a row of `cols` is split into `blocks` slices of whole vectors of `vec`.
SMS_HOST_DEVICE int64_t slice_columns(int64_t cols, int vec, int blocks) {
  return ceil_div(ceil_div(cols, vec), blocks) * vec;
}

// The part of a row a block of the two-pass kernels takes: one of `blocks_per_row` slices of whole vectors, in
// the rank order of the blocks of a cluster, and the rows it takes one after another.
struct RowSlice {
  int64_t begin;
  int64_t end;
  int blocks_per_row;

  __device__ RowSlice(int64_t cols, int vec, int blocks_per_row) : blocks_per_row(blocks_per_row) {
    const int64_t width = slice_columns(cols, vec, blocks_per_row);
    const int64_t start = static_cast<int64_t>(blockIdx.x % blocks_per_row) * width;
    begin = start < cols ? start : cols;
    end = start + width < cols ? start + width : cols;
  }

  __device__ __forceinline__ int64_t first_row() const { return blockIdx.x / blocks_per_row; }
  __device__ __forceinline__ int64_t row_step() const { return gridDim.x / blocks_per_row; }
};

// Calls body(visit, begin, width, reduce) for each of `visits` rows (or groups of rows) a block takes in a kernel
// that splits rows of `cols` over the blocks of a cluster (launch_clusters): `visit` counts them as a grid takes
// them, [begin, begin + width) is the block's slice of the row, and reduce(value, op, identity) combines one value a
// thread over the whole row, through distributed shared memory. Value: what the reductions carry (a float, a double,
// or two floats packed in 64 bits), one type a kernel. Every thread of every block of the cluster runs it.
template <typename Value, int VEC, typename Body>
__device__ __forceinline__ void for_each_cluster_visit(int64_t cols, int64_t visits, int blocks_per_row, Body&& body) {
  __shared__ Value shared[kWarp];
  __shared__ ClusterExchange<Value, kMaxClusterBlocks> exchange;
  const RowSlice slice(cols, VEC, blocks_per_row);
  exchange.start();
  int round = 0;
  const auto reduce = [&](auto value, auto op, auto identity) {
    static_assert(std::is_same_v<decltype(value), Value>, "for_each_cluster_visit reduces values of one type");
    return exchange.reduce(row_reduce(value, op, identity, blockDim.x, shared), op, blocks_per_row, round++);
  };
  for (int64_t visit = slice.first_row(); visit < visits; visit += slice.row_step()) {
    body(visit, static_cast<int>(slice.begin), static_cast<int>(slice.end - slice.begin), reduce);
  }
  exchange.finish();
}

// Threads, in whole warps, that hold `vectors` at `iters` vectors a thread.
inline int threads_holding(int64_t vectors, int iters) {
  return static_cast<int>(round_up(ceil_div(vectors, iters), kWarp));
}

// Rows that one block (or a group of lanes) holds in registers, `target_iters` vectors per thread where the row
// allows; `registers_per_vector`: what one vector of the row costs a thread (all operands it holds). Rows of up to
// kWarp * kTargetIters vectors are shared by groups of lanes, whatever the target.
inline RowPlan plan_block(int64_t cols, int vec, int registers_per_vector, int target_iters = kTargetIters) {
  const int64_t vectors = ceil_div(cols, vec);
  if (vectors <= kWarp * kTargetIters) {
    // Short rows: a group of lanes per row, so that a warp may hold many rows.
    const int width = next_power_of_two(std::min<int64_t>(ceil_div(vectors, target_iters), kWarp));
    return {true, next_power_of_two(ceil_div(vectors, width)), kShortRowThreads, width};
  }
  for (int iters = target_iters; iters <= kMaxIters; iters *= 2) {
    const int threads = threads_holding(vectors, iters);
    if (threads <= max_threads_for(iters * registers_per_vector)) return {true, iters, threads, threads};
  }
  return {false, 1, kLongRowThreads, kLongRowThreads};
}

// The plan of the register kernels' rows: plan_block's, except that rows of more than a warp's kTargetIters vectors
// and up to its kMaxIters take one warp at as many vectors a thread as they need (5-8), where plan_block gives blocks
// of two warps at kTargetIters, up to half of each thread's vectors empty, with a barrier in each reduction. Over the
// floor (benchmarks/NOTES.md, v106, v107 and v110): bf16 rows of 1500 columns that start mid-vector 1.40 -> 1.05
// without a mask, causal 1.64 -> 1.29 (H200); rows of 1088 columns 1.15 -> 1.00, causal 1.30 -> 1.05, 1152 columns
// 1.11 -> 1.00 (H100); the causal backward of 1023 columns 1.20 -> 1.07, of 1088 1.07 -> 1.03 (H100). Element by
// element (vec 1): plan_block's.
inline RowPlan register_plan(int64_t cols, int vec, int registers_per_vector, int target_iters = kTargetIters) {
  const int64_t vectors = ceil_div(cols, vec);
  if (vec > 1 && vectors > kWarp * kTargetIters && vectors <= kWarp * kMaxIters) {
    return {true, static_cast<int>(ceil_div(vectors, kWarp)), kWarp, kWarp};
  }
  return plan_block(cols, vec, registers_per_vector, target_iters);
}

// Whether `plan` is register_plan's one warp past kTargetIters vectors a thread (with_past_target_iters).
inline bool one_warp_past_target(const RowPlan& plan) { return plan.threads == kWarp && plan.iters > kTargetIters; }

// The most columns a row that starts mid-vector spans, read from the vector boundary before it (the register
// kernels' kShifted): its own and up to vec - 1 before its start. So rows of 1018-1024 bf16 columns span 129 vectors,
// one past what a warp holds at kTargetIters a thread.
SMS_HOST_DEVICE int64_t shifted_span(int64_t cols, int vec) { return cols + vec - 1; }

// The columns a row spans as a kernel reads it: shifted_span where it starts mid-vector (kShifted), its own otherwise.
template <bool kShifted>
SMS_HOST_DEVICE int64_t columns_spanned(int64_t cols, int vec) {
  return kShifted ? shifted_span(cols, vec) : cols;
}

// The plan of rows that start mid-vector: register_plan's for the columns they span.
inline RowPlan shifted_plan(int64_t cols, int vec, int registers_per_vector, int target_iters = kTargetIters) {
  return register_plan(shifted_span(cols, vec), vec, registers_per_vector, target_iters);
}

inline int current_device() {
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// The current device's `attribute`.
inline int device_attribute(cudaDeviceAttr attribute) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, current_device()));
  return value;
}

inline int64_t l2_bytes() { return device_attribute(cudaDevAttrL2CacheSize); }

// Grids stride over rows; this cap only guards the launch limit.
constexpr int64_t kMaxBlocks = 1 << 30;

// Blocks of a register kernel: one a row (or a block's rows), capped so that a grid's rows, the stride of
// RowCover, fit in 32 bits.
inline unsigned blocks_for(int64_t rows, const RowPlan& plan) {
  const int rows_per_block = plan.threads / plan.width;
  return static_cast<unsigned>(
      std::min(ceil_div(rows, rows_per_block), int64_t{std::numeric_limits<int>::max()} / rows_per_block));
}

// The answer of ask() about launching `kernel` on the current device in blocks of `threads` threads, in clusters of
// `cluster_blocks`, with `shared_bytes` of dynamic shared memory. Such answers (what the device runs of the kernel,
// how many blocks or clusters it holds at once) depend on nothing else, and asking the runtime for them takes
// microseconds of host time, so each is asked once and kept.
inline int remembered(const void* kernel, int threads, int cluster_blocks, int64_t shared_bytes,
                      c10::function_ref<int()> ask) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, int, int64_t>, int> answers;
  const auto shape = std::make_tuple(current_device(), kernel, threads, cluster_blocks, shared_bytes);
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = answers.find(shape);
  if (found != answers.end()) return found->second;
  const int answer = ask();
  answers.emplace(shape, answer);
  return answer;
}

// Whether the current device runs `kernel` from sm_90 code (the clusters and bulk copies of the kernels that
// launch_clusters and launch_staged launch need it) with `shared_bytes` of dynamic shared memory. The kernel may
// then take all the shared memory a block may have, so that any launch of it with less than that is allowed.
template <typename Kernel>
bool runs_sm90_with(Kernel kernel, int64_t shared_bytes) {
  cudaFuncAttributes attributes;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int64_t most = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - attributes.sharedSizeBytes;
  if (attributes.binaryVersion < 90 || shared_bytes > most) return false;
  if (shared_bytes > 0) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)));
  }
  return true;
}

// Blocks of `kernel` (of `threads` threads and `shared_bytes` of dynamic shared memory) that a multiprocessor of the
// current device holds at once; 0 where the device runs no sm_90 code of it or cannot give it that shared memory.
template <typename Kernel>
int resident_sm90_blocks(Kernel kernel, int threads, int64_t shared_bytes) {
  return remembered(reinterpret_cast<const void*>(kernel), threads, 1, shared_bytes, [&] {
    if (!runs_sm90_with(kernel, shared_bytes)) return 0;
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes));
    return blocks;
  });
}

// Blocks of `kernel` (of `threads` threads, no dynamic shared memory) that a multiprocessor of the current device
// holds at once.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads) {
  return remembered(reinterpret_cast<const void*>(kernel), threads, 1, 0, [&] {
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
    return blocks;
  });
}

// A launch of `blocks` blocks of `threads` threads (and `shared_bytes` of dynamic shared memory) in clusters of
// `blocks_per_row`; `cluster`, the attribute that says so, must outlive it.
inline cudaLaunchConfig_t cluster_launch(cudaLaunchAttribute& cluster, int64_t blocks, int blocks_per_row, int threads,
                                         int64_t shared_bytes, cudaStream_t stream) {
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = blocks_per_row;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return config;
}

// The most blocks a cluster has on every device with clusters.
constexpr int kPortableClusterBlocks = 8;

// SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=1: no cluster of more than kPortableClusterBlocks, as on a device that allows
// no more. compute-sanitizer's synccheck (CUDA 13, sm_90) stops with an illegal address, reporting nothing, in any
// kernel that initialises an mbarrier and runs in several clusters of more (benchmarks/NOTES.md, "synccheck").
inline bool portable_clusters_only() {
  static const bool only = [] {
    const char* value = std::getenv("SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return only;
}

// Clusters of `blocks_per_row` blocks of `kernel` (of `threads` threads and `shared_bytes` of dynamic shared memory)
// that the current device holds at once; 0 where the kernel has no sm_90 code or the device holds no such cluster.
template <typename Params>
int resident_clusters(void (*kernel)(Params, int), int blocks_per_row, int threads, int64_t shared_bytes) {
  return remembered(reinterpret_cast<const void*>(kernel), threads, blocks_per_row, shared_bytes, [&] {
    if (!runs_sm90_with(kernel, shared_bytes)) return 0;
    if (blocks_per_row > kPortableClusterBlocks &&
        (portable_clusters_only() ||
         cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
      // A device without larger clusters (the H100 and H200 allow 16), or told to act as one.
      (void)cudaGetLastError();
      return 0;
    }
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = cluster_launch(cluster, blocks_per_row, blocks_per_row, threads, shared_bytes,
                                                     nullptr);
    int clusters = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    return clusters;
  });
}

// Launches kernel(p, blocks_per_row) on clusters of `blocks_per_row` blocks of `threads` threads, a cluster to each
// of `visits` rows (for_each_cluster_visit); false where the kernel has no sm_90 code or the device holds no such
// cluster. `shared_bytes`: the dynamic shared memory of a staged kernel's blocks (staged.cuh), which loop over rows
// in a grid the device holds at once.
template <typename Params>
bool launch_clusters_over(void (*kernel)(Params, int), const Params& p, int64_t visits, int blocks_per_row, int threads,
                          cudaStream_t stream, int64_t shared_bytes = 0) {
  const int resident = resident_clusters(kernel, blocks_per_row, threads, shared_bytes);
  if (resident == 0) return false;
  const int64_t clusters = std::min(visits, shared_bytes > 0 ? int64_t{resident} : kMaxBlocks / blocks_per_row);
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config =
      cluster_launch(cluster, clusters * blocks_per_row, blocks_per_row, threads, shared_bytes, stream);
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, blocks_per_row));
  return true;
}

// launch_clusters_over p's rows.
template <typename Params>
bool launch_clusters(void (*kernel)(Params, int), const Params& p, int blocks_per_row, int threads,
                     cudaStream_t stream, int64_t shared_bytes = 0) {
  return launch_clusters_over(kernel, p, p.rows, blocks_per_row, threads, stream, shared_bytes);
}

// Vectors a thread of the cluster register kernels holds where a row would take kMaxClusterBlocks blocks at
// kTargetIters: twice as many, in fewer blocks. A GPC holds whole clusters, so clusters of 16 leave 15% of
// an H200's block slots idle (14 clusters of 16 at two blocks a multiprocessor, against 30 of 8 or 62 of 4;
// benchmarks/NOTES.md, v20); blocks of twice the registers take one slot a multiprocessor each instead of two.
constexpr int kWideClusterIters = 2 * kTargetIters;

// How the cluster register kernels split a row: `blocks_per_row` blocks of `threads` threads, `wide`: at
// kWideClusterIters vectors a thread rather than kTargetIters. blocks_per_row is 0 where they do not: rows with a
// causal limit (most of their slices would hold only zeros), rows that one block holds or that more than
// kMaxClusterBlocks do.
struct ClusterShape {
  int blocks_per_row;
  int threads;
  bool wide;
};

// The fewest blocks of at most `max_threads` threads that hold a row of `vectors` at kWideClusterIters a thread.
inline int fewest_wide_blocks(int64_t vectors, int max_threads) {
  return static_cast<int>(ceil_div(vectors, int64_t{kWideClusterIters} * max_threads));
}

// As few blocks as hold a row of `cols` at kTargetIters vectors a thread and at most `max_threads` threads a block,
// a power of two up to kMaxClusterBlocks; where a row would take kMaxClusterBlocks, half as many at
// kWideClusterIters: the count the staged forward starts from, which the register kernels' launchers replace by
// most_resident_wide's.
inline ClusterShape split_over_cluster(int64_t cols, int vec, int max_threads) {
  const int64_t vectors = ceil_div(cols, vec);
  int blocks_per_row = next_power_of_two(ceil_div(vectors, int64_t{kTargetIters} * max_threads));
  // One block's rows are the register kernels'.
  if (blocks_per_row < 2 || blocks_per_row > kMaxClusterBlocks) return {0, 0, false};
  const bool wide = blocks_per_row == kMaxClusterBlocks;
  if (wide) blocks_per_row /= 2;
  // RowSlice's slices: as many whole vectors to each block but the last.
  const int64_t slice_vectors = ceil_div(vectors, blocks_per_row);
  const int iters = wide ? kWideClusterIters : kTargetIters;
  return {blocks_per_row, threads_holding(slice_vectors, iters), wide};
}

// split_over_cluster's shape of p's rows, but none for rows with a causal limit.
template <typename Params>
ClusterShape cluster_shape(const Params& p, int vec, int max_threads) {
  return p.is_causal ? ClusterShape{0, 0, false} : split_over_cluster(p.cols, vec, max_threads);
}

// The wide `shape` in the count of blocks from the fewest that hold a row of `cols` at
// kWideClusterIters (`max_threads` a block) to kMaxClusterBlocks whose clusters of `kernel` keep the most rows
// resident on the device, counted twice where a multiprocessor holds two blocks or more (the fewest such). A block of
// the wide kernels takes 80-128 registers a thread, so whether a multiprocessor holds one block, two or three turns
// on its threads. A multiprocessor of one block has nothing to overlap a row's exchanges with; past two, the rows at
// once decide (warps resident would count the near-empty last warp of a small slice). bf16 at 131,077 columns, the
// forward with an additive mask: 5 blocks of 13 warps (one a multiprocessor, 23 clusters at once) and 16 of 5 (three,
// 21) took 1.24 of the floor, 9 of 8 (two, 23) 1.15; with key padding 1.88 -> 1.74; the backward 1.14 -> 1.07 (an
// H100; benchmarks/NOTES.md, v150, v154 and v155).
template <typename Params>
ClusterShape most_resident_wide(void (*kernel)(Params, int), const ClusterShape& shape, int64_t cols, int vec,
                                int max_threads) {
  const int64_t vectors = ceil_div(cols, vec);
  ClusterShape most = shape;
  int64_t most_rank = 0;
  for (int blocks = fewest_wide_blocks(vectors, max_threads); blocks <= kMaxClusterBlocks; ++blocks) {
    const int threads = threads_holding(ceil_div(vectors, blocks), kWideClusterIters);
    const int clusters = resident_clusters(kernel, blocks, threads, 0);
    const int64_t rank = int64_t{clusters} * std::min(2, resident_sm90_blocks(kernel, threads, 0));
    if (rank > most_rank) {
      most = {blocks, threads, true};
      most_rank = rank;
    }
  }
  return most;
}

// Launches kernel(p, blocks_per_row), a kernel that holds a row split over the blocks of a cluster in registers, as
// `shape` splits it; where it is wide, wide_kernel in the count of blocks that most_resident_wide takes (rows of
// `cols` from the vector boundary before each, `max_threads` a block). False where `shape` does not split the row or
// the device holds no such cluster.
template <typename Params>
bool launch_in_cluster(void (*kernel)(Params, int), void (*wide_kernel)(Params, int), const Params& p,
                       const ClusterShape& shape, int64_t cols, int vec, int max_threads, cudaStream_t stream) {
  if (shape.blocks_per_row == 0) return false;
  if (!shape.wide) return launch_clusters(kernel, p, shape.blocks_per_row, shape.threads, stream);
  const ClusterShape wide = most_resident_wide(wide_kernel, shape, cols, vec, max_threads);
  return launch_clusters(wide_kernel, p, wide.blocks_per_row, wide.threads, stream);
}

// Launches kernel(p, blocks_per_row), a two-pass kernel. A row without a causal limit is split over the blocks of
// one cluster where the device holds one, enough (up to kMaxClusterBlocks) that a slice is at most kSweepsPerSlice
// unrolled sweeps of a block: small slices are still in L2 when the second pass reads them, and a row's work is
// spread over more multiprocessors. Otherwise a block takes a whole row. benchmarks/NOTES.md, v6: slices of one or
// two sweeps, and causal rows in clusters (most of their slices hold only zeros), measured slower; v10: fewer rows
// at once, to keep pass 1's reads within the L2, measured slower too.
template <typename Params>
void launch_two_pass(void (*kernel)(Params, int), const Params& p, int vec, cudaStream_t stream) {
  const int64_t slice = static_cast<int64_t>(kLongRowThreads) * kUnroll * vec * kSweepsPerSlice;
  if (!p.is_causal) {
    for (int blocks_per_row = std::min<int>(next_power_of_two(ceil_div(p.cols, slice)), kMaxClusterBlocks);
         blocks_per_row > 1; blocks_per_row /= 2) {
      if (launch_clusters(kernel, p, blocks_per_row, kLongRowThreads, stream)) return;
    }
  }
  kernel<<<static_cast<unsigned>(std::min(p.rows, kMaxBlocks)), kLongRowThreads, 0, stream>>>(p, 1);
}

// Zeroes bytes [from, from + span) of each row of `out`, row_bytes apart, a 16-byte word a thread, neighbouring
// threads on neighbouring words, as a memset writes: a row's words counted from the 16-byte boundary at or before its
// span's start (`words_per_row` of them, the most any row's span touches), those its ends cut stored an Element (the
// output's element size) at a time. Rows whose spans do not start 16-byte aligned were zeroed 2 bytes a thread: fp32
// causal rows of 9001 columns narrowed to 1024 took 3.3 times their floor (an H100; benchmarks/NOTES.md, v132).
constexpr int kZeroThreads = 256;

template <typename Element>
__global__ void __launch_bounds__(kZeroThreads)
    zero_spans(unsigned char* out, int64_t row_bytes, int64_t from, int64_t span, Divisor words_per_row,
               int64_t words) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * kZeroThreads + threadIdx.x;
  if (word >= words) return;
  int64_t column;
  const int64_t row = words_per_row.quotient(word, column);
  const uintptr_t begin = reinterpret_cast<uintptr_t>(out + row * row_bytes + from);
  const uintptr_t end = begin + span;
  const uintptr_t at = begin / 16 * 16 + 16 * column;
  if (at >= begin && at + 16 <= end) {
    *reinterpret_cast<uint4*>(at) = uint4{};
    return;
  }
#pragma unroll
  for (int i = 0; i < 16 / static_cast<int>(sizeof(Element)); ++i) {
    const uintptr_t element = at + i * sizeof(Element);
    if (element >= begin && element < end) *reinterpret_cast<Element*>(element) = Element{};
  }
}

// Causal rows of at least this many columns that see at most half their keys (upper-left, at most half as many
// queries as keys) are narrowed to what they see before any other kernel is tried, forward and backward. Shorter
// rows are faster whole: at 1024 columns, narrowed, the forward measured 6-14% slower (its tails written after the
// launch) and the backward 1% (v93).
constexpr int64_t kHalfNarrowedFromColumns = 2048;
// narrowed_to_visible's `parts` for those rows: they see at most 1/2 of their keys.
constexpr int kHalfNarrowedParts = 2;
// Rows that are no whole vectors from a vector boundary (unaligned_ladder, unaligned_backward_ladder), which whole are
// read in vectors from the boundary before each row, are narrowed so only from this many columns. Upper-left, 1000
// queries (an H100; benchmarks/NOTES.md, v137), ours over the floor, whole -> narrowed: at 2051 columns slower (fp32
// forward 1.12 -> 1.29, bf16 backward 1.28 -> 1.43); at 4099 even, the forward staged whole (v138: fp32 1.17 against
// 1.21 narrowed); from 6145 faster, backward fp32 1.29 -> 1.15, bf16 1.38 -> 1.31, the forward as fast or faster.
constexpr int64_t kUnalignedNarrowedFromColumns = 6144;

// The columns narrowed_to_visible takes p's causal rows up to: as many as the longest row sees, in whole 128-byte lines
// of 16-bit rows.
template <typename Params>
int64_t narrowed_columns(const Params& p) {
  constexpr int64_t kColumnsAlike = 64;
  return round_up(std::max<int64_t>(p.queries.value + p.causal_offset, 1), kColumnsAlike);
}

// Where p's causal rows see at most 1/`parts` of their keys (upper-left, fewer queries than keys): zeroes every row of
// `output` from the first multiple of 64 columns past what any row sees, then launch(narrowed), narrowed being p taken
// up to that column, so that kernels sized for the rows' visible part take them, rather than a kernel sized for the
// whole row which pays each row's chain of loads and reductions over its hidden part too; and returns true. Otherwise
// false, having launched nothing. The forward's kernels make NaN the zeros of a row that comes out NaN (its columns
// past narrowed.cols up to output_row_stride). The zeros are written as a memset writes them, from every
// multiprocessor at once; a memset of the whole output first and a kernel writing only what the rows see measured
// 20-25% slower at 65,536 bf16 columns, its rows' chains no longer hidden behind their zeros (benchmarks/NOTES.md, v19
// and v86). Written after the launch instead, each word waiting on its row's first element, y's zeros cost a narrowed
// forward 5-9% (version 68).
template <typename scalar_t, typename Params, typename Launch>
bool narrowed_to_visible(const Params& p, scalar_t* output, int parts, cudaStream_t stream, const Launch& launch) {
  if (!p.is_causal || parts * (p.queries.value + p.causal_offset) > p.cols) return false;
  // The forward's narrowed kernels count a row's columns up to output_row_stride in int.
  if (p.output_row_stride > std::numeric_limits<int>::max()) return false;
  const int64_t columns = narrowed_columns(p);
  if (columns >= p.cols) return false;
  using Element = std::conditional_t<sizeof(scalar_t) == 2, uint16_t,
                                     std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint64_t>>;
  const int64_t row_bytes = p.output_row_stride * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t from = columns * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t span = (p.cols - columns) * static_cast<int64_t>(sizeof(scalar_t));
  // Rows a whole number of 16-byte words apart start their spans as far into a word each; others as far as any may.
  const int64_t lead = row_bytes % 16 == 0 ? static_cast<int64_t>((reinterpret_cast<uintptr_t>(output) + from) % 16)
                                           : 16 - static_cast<int64_t>(sizeof(scalar_t));
  const int64_t words_per_row = ceil_div(lead + span, 16);
  const int64_t words = p.rows * words_per_row;
  zero_spans<Element><<<static_cast<unsigned>(ceil_div(words, kZeroThreads)), kZeroThreads, 0, stream>>>(
      reinterpret_cast<unsigned char*>(output), row_bytes, from, span, Divisor(words_per_row), words);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  Params narrowed = p;
  narrowed.cols = columns;
  launch(narrowed);
  return true;
}

// Calls body(std::bool_constant<flag>{}), and returns what it returns: a runtime flag as a template argument.
template <typename Body>
decltype(auto) with_flag(bool flag, Body&& body) {
  if (flag) return body(std::true_type{});
  return body(std::false_type{});
}

// Calls body(std::integral_constant<int, iters>{}) for iters in 1, 2, 4, 8, and returns what it returns.
template <typename Body>
decltype(auto) with_iters(int iters, Body&& body) {
  switch (iters) {
    case 1: return body(std::integral_constant<int, 1>{});
    case 2: return body(std::integral_constant<int, 2>{});
    case 4: return body(std::integral_constant<int, 4>{});
    default: return body(std::integral_constant<int, 8>{});
  }
}

// As with_iters, for iters of kTargetIters + 1 to kMaxIters: register_plan's rows of one warp.
template <typename Body>
decltype(auto) with_past_target_iters(int iters, Body&& body) {
  static_assert(kTargetIters + 4 == kMaxIters);
  switch (iters) {
    case kTargetIters + 1: return body(std::integral_constant<int, kTargetIters + 1>{});
    case kTargetIters + 2: return body(std::integral_constant<int, kTargetIters + 2>{});
    case kTargetIters + 3: return body(std::integral_constant<int, kTargetIters + 3>{});
    default: return body(std::integral_constant<int, kMaxIters>{});
  }
}

}  // namespace sms
