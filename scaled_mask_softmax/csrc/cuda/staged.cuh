// Rows brought into shared memory by the copy engine (sm_90 bulk copies) ahead of the block that works on them:
// the persistent loop of the staged kernels, and their launch.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "async_copy.cuh"
#include "launch.h"

namespace sms {

// Rows a block of the staged forward kernels keeps on their way at once: the one it works on and the next.
constexpr int kStagedRows = 2;

// Where the register kernel fits at most this many blocks a multiprocessor, and so has at most that many rows on
// their way at once, the staged kernel takes its rows. Forward, 16-bit rows of 16,384 columns (two blocks) measured
// 1.171 -> 1.135 of the floor, fp32 (one) 1.173 -> 1.094; rows of 4096 columns in eight blocks of 128 threads,
// 1.063 -> 1.184, and of 1024 in one- and two-warp blocks, 1.020 -> 1.153 (benchmarks/NOTES.md, v22).
constexpr int kStagedMaxBlocks = 2;

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

// Where a row's two operands come from (either may have 0 bytes), as one thread sends for them.
struct StagedCopy {
  const void* first;
  const void* second;
  uint32_t first_bytes;
  uint32_t second_bytes;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Run by one thread: the bulk copies of `copy` into `stage` (its second operand from `second_offset`), counted on
// `barrier`.
__device__ __forceinline__ void send_for(const StagedCopy& copy, unsigned char* stage, int64_t second_offset,
                                         uint64_t* barrier) {
  barrier_arrive_expecting(barrier, copy.first_bytes + copy.second_bytes);
  if (copy.first_bytes > 0) bulk_copy_to_shared(stage, copy.first, copy.first_bytes, barrier);
  if (copy.second_bytes > 0) bulk_copy_to_shared(stage + second_offset, copy.second, copy.second_bytes, barrier);
}

// The k-th visit of a staged loop, its row `visit` known: waits for the row's copies to land in its stage, calls
// body, and sends for the row kStages visits on (`ahead`, where `more`: the sending thread's) into the same stage once
// every thread is done with it.
template <int kStages, typename Body>
__device__ __forceinline__ void work_on_stage(int64_t visit, int k, bool more, const StagedCopy& ahead,
                                              unsigned char* stages, int64_t stage_bytes, int64_t second_offset,
                                              uint64_t (&landed)[kStages], Body&& body) {
  const int stage = k % kStages;
  barrier_wait(&landed[stage], (k / kStages) & 1);
  bool sent = false;
  const auto send_ahead = [&] {
    if (more && !sent) send_for(ahead, stages + stage * stage_bytes, second_offset, &landed[stage]);
    sent = true;
  };
  body(visit, stages + stage * stage_bytes, send_ahead);
  if (kStages > 1 && !sent) {
    __syncthreads();
    send_ahead();
  }
}

// Calls body(visit, stage, send_ahead) for the rows a block of a persistent grid takes (first, first + step, ...
// before `rows`), each in `stage`, `stage_bytes` of the block's dynamic shared memory, once the copies that
// locate(visit) gives (a StagedCopy) have landed there: one thread sends for them, kStages rows ahead, into the
// stage a row leaves once every thread is done with it. body may call send_ahead() as soon as every thread has read
// the stage into registers (after a row's first reduction); where it does not, the loop sends after body, at a
// barrier. With one stage, body must. The row to send for is located before body, by the thread that sends, and
// waits in shared memory: located after body, or held in registers across it, it spilled 8-132 bytes (ptxas, sm_90,
// at 64 registers).
template <int kStages, typename Locate, typename Body>
__device__ __forceinline__ void for_each_staged_row(int64_t first, int64_t step, int64_t rows, int64_t stage_bytes,
                                                    int64_t second_offset, Locate&& locate, Body&& body) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[kStages];
  __shared__ StagedCopy ahead;
  const bool leader = threadIdx.x == 0;
  if (leader) {
    for (int stage = 0; stage < kStages; ++stage) barrier_init(&landed[stage], 1);
    barrier_init_fence();
  }
  __syncthreads();
  for (int stage = 0; stage < kStages; ++stage) {
    const int64_t visit = first + stage * step;
    if (leader && visit < rows) send_for(locate(visit), stages + stage * stage_bytes, second_offset, &landed[stage]);
  }
  int k = 0;
  for (int64_t visit = first; visit < rows; visit += step, ++k) {
    const bool more = leader && visit + kStages * step < rows;
    if (more) ahead = locate(visit + kStages * step);
    work_on_stage(visit, k, more, ahead, stages, stage_bytes, second_offset, landed, body);
  }
}

// for_each_staged_row over rows drawn from `next_row`, a zeroed counter that every block of the grid draws from: a
// block draws each row as it sends for it, kStages rows ahead (the draw's round trip hides behind the rows in
// flight), so the grid takes rows in order, whichever blocks are ahead. Blocks that take rows by stride drift apart:
// in a skeleton of forward_staged's traffic their ends spread over 150-290 us of a 275 us kernel, and drawn rows
// moved 4-6% more; forward_staged at 16,384 bf16 columns measured 1.114 -> 1.031 of the floor, causal at 4096
// 1.215 -> 1.107 (benchmarks/NOTES.md, v81). The drawn rows wait in a ring of kStages + 1 slots in shared memory,
// each written kStages visits before it is read, a body's barriers between.
template <int kStages, typename Locate, typename Body>
__device__ __forceinline__ void for_each_drawn_row(unsigned long long* next_row, int64_t rows, int64_t stage_bytes,
                                                   int64_t second_offset, Locate&& locate, Body&& body) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[kStages];
  __shared__ StagedCopy ahead;
  __shared__ int64_t visits[kStages + 1];
  const bool leader = threadIdx.x == 0;
  const auto draw = [&] { return static_cast<int64_t>(atomicAdd(next_row, 1ull)); };
  if (leader) {
    for (int stage = 0; stage < kStages; ++stage) barrier_init(&landed[stage], 1);
    barrier_init_fence();
    for (int stage = 0; stage < kStages; ++stage) {
      visits[stage] = draw();
      if (visits[stage] < rows) {
        send_for(locate(visits[stage]), stages + stage * stage_bytes, second_offset, &landed[stage]);
      }
    }
  }
  __syncthreads();
  for (int k = 0;; ++k) {
    // A block's draws only grow: once one is past the last row, every later one is too.
    const int64_t visit = visits[k % (kStages + 1)];
    if (visit >= rows) break;
    bool more = false;
    if (leader) {
      const int64_t later = draw();
      visits[(k + kStages) % (kStages + 1)] = later;
      more = later < rows;
      if (more) ahead = locate(later);
    }
    work_on_stage(visit, k, more, ahead, stages, stage_bytes, second_offset, landed, body);
  }
}

// for_each_drawn_row for the blocks of a cluster, which split each row and so must take the same rows: the cluster's
// first block draws each row from `next_row` and sends it (st.async) into slot j % kRing of every block's ring, a
// visit before any block sends for that row's copies, counted on the slot's barrier (`told`), on which each block's
// sending thread arrives for it and every thread waits before reading it. After the last row, each sending thread
// takes the row told past it, so that no block exits with a send to it on its way. `blocks`: the cluster's.
template <int kStages, typename Locate, typename Body>
__device__ __forceinline__ void for_each_cluster_drawn_row(unsigned long long* next_row, int64_t rows, int blocks,
                                                           int64_t stage_bytes, int64_t second_offset,
                                                           Locate&& locate, Body&& body) {
  // A slot is told a visit before its row is sent for, kStages visits before it is worked on.
  constexpr int kRing = kStages + 2;
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[kStages];
  __shared__ uint64_t told[kRing];
  __shared__ int64_t visits[kRing];
  __shared__ StagedCopy ahead;
  const bool leader = threadIdx.x == 0;
  uint32_t rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  // The first block's sending thread: visit j's row to every block.
  const auto tell = [&](int j) {
    const uint64_t row = atomicAdd(next_row, 1ull);
    const int slot = j % kRing;
    for (int b = 0; b < blocks; ++b) {
      send_to_cluster_block(in_cluster_block(&visits[slot], b), row, in_cluster_block(&told[slot], b));
    }
  };
  // A block's sending thread: visit j's row, once told.
  const auto learn = [&](int j) {
    const int slot = j % kRing;
    barrier_arrive_expecting(&told[slot], sizeof(int64_t));
    barrier_wait(&told[slot], (j / kRing) & 1);
    return visits[slot];
  };
  if (leader) {
    for (int stage = 0; stage < kStages; ++stage) barrier_init(&landed[stage], 1);
    for (int slot = 0; slot < kRing; ++slot) barrier_init(&told[slot], 1);
    barrier_init_fence();
  }
  // Every block's barriers are set up before the first block sends to them.
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  if (leader) {
    if (rank == 0) {
      for (int j = 0; j <= kStages; ++j) tell(j);
    }
    for (int stage = 0; stage < kStages; ++stage) {
      const int64_t row = learn(stage);
      if (row < rows) send_for(locate(row), stages + stage * stage_bytes, second_offset, &landed[stage]);
    }
  }
  int k = 0;
  for (;; ++k) {
    // Every block reads the same rows, and so leaves the loop at the same visit.
    barrier_wait(&told[k % kRing], (k / kRing) & 1);
    const int64_t visit = visits[k % kRing];
    if (visit >= rows) break;
    bool more = false;
    if (leader) {
      if (rank == 0) tell(k + kStages + 1);
      const int64_t later = learn(k + kStages);
      more = later < rows;
      if (more) ahead = locate(later);
    }
    work_on_stage(visit, k, more, ahead, stages, stage_bytes, second_offset, landed, body);
  }
  // Told at the visit before the last, or at the start: the one row sent to this block and not yet taken.
  if (leader) learn(k + kStages);
}

#endif

// A counter of rows drawn, zeroed on the current stream: one for each launch of a kernel whose blocks draw rows.
inline at::Tensor zeroed_row_counter() {
  return at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, current_device()));
}

// Launches kernel(p), a staged kernel of `threads` threads a block and `bytes` of shared memory for its stages, in a
// persistent grid whose blocks draw their rows from a counter zeroed for the launch (p.next_row: for_each_drawn_row),
// where register_kernel, the kernel that would take the rows otherwise, fits at most `max_register_blocks` blocks a
// multiprocessor, the device runs kernel's sm_90 code, and kernel's shared memory leaves a multiprocessor as many
// blocks as register_kernel's registers do; false otherwise.
template <typename Params, typename... Args>
bool launch_staged(void (*kernel)(Params), void (*register_kernel)(Params, Args...), const Params& p, int threads,
                   int64_t bytes, cudaStream_t stream, int max_register_blocks = kStagedMaxBlocks) {
  const int register_blocks = resident_sm90_blocks(register_kernel, threads, 0);
  if (register_blocks > max_register_blocks) return false;
  const int staged_blocks = resident_sm90_blocks(kernel, threads, bytes);
  if (staged_blocks == 0 || staged_blocks < register_blocks) return false;
  const int64_t resident = int64_t{staged_blocks} * device_attribute(cudaDevAttrMultiProcessorCount);
  const at::Tensor next_row = zeroed_row_counter();
  Params params = p;
  params.next_row = reinterpret_cast<unsigned long long*>(next_row.data_ptr<int64_t>());
  kernel<<<static_cast<unsigned>(std::min(p.rows, resident)), threads, bytes, stream>>>(params);
  return true;
}

}  // namespace sms
