// What streaming structures sustain on the GPU, beside cudaMemcpy: plain copies (persistent or one tile a block,
// on all multiprocessors or some), the skeletons of a row-wise forward (a row of bf16 loaded, one block reduction,
// the row stored; persistent, rows drawn in order, or one row a block; from global memory or staged by the copy
// engine) and a whole bf16 softmax. Every case moves 512 MiB in and 512 MiB out; best and mean of 30 launches.
// Standalone (no torch), for sm_90:
//   nvcc -arch=sm_90 -std=c++17 -o /tmp/streams benchmarks/probes/streams.cu && /tmp/streams
// T: threads a block, U: 16-byte vectors a thread, C: a row's columns, n/SM: blocks a multiprocessor.
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "../../scaled_mask_softmax/csrc/cuda/async_copy.cuh"
using namespace sms;

__device__ __forceinline__ uint32_t block_sum(uint32_t v, uint32_t* slots) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? slots[threadIdx.x] : 0;
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
  __syncthreads();
  return v;
}

// One row's skeleton: U vectors a thread loaded from `src`, one block reduction, then after_reduction() (every thread
// has read `src` by then), the row stored to `dst` (the reduction kept by a test that never holds).
template <int U, typename After>
__device__ __forceinline__ void move_row(const int4* src, int4* dst, uint32_t* slots, After&& after_reduction) {
  int4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) v[u] = src[threadIdx.x + u * blockDim.x];
  uint32_t s = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) s += v[u].x;
  s = block_sum(s, slots);
  after_reduction();
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (s == 0x12345u) v[u].y = 0;
    dst[threadIdx.x + u * blockDim.x] = v[u];
  }
}

template <int U>
__device__ __forceinline__ void move_row(const int4* src, int4* dst, uint32_t* slots) {
  move_row<U>(src, dst, slots, [] {});
}

// A plain copy's tile: U vectors a thread, all loaded before any is stored.
template <int U>
__device__ __forceinline__ void copy_tile(const int4* in, int4* out) {
  int4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) v[u] = in[(long)u * blockDim.x];
#pragma unroll
  for (int u = 0; u < U; ++u) out[(long)u * blockDim.x] = v[u];
}

// Row in registers: each thread U vectors, loaded straight from global memory.
template <int U>
__global__ void rows_in_registers(const int4* in, int4* out, int rows, int vecs) {
  extern __shared__ char pad[];
  __shared__ uint32_t slots[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int4* src = in + (long)r * vecs;
    move_row<U>(src, out + (long)r * vecs, slots);
  }
}

// Row staged: the copy engine brings rows into shared memory two ahead; the block reads its row into registers.
template <int U>
__global__ void rows_staged(const int4* in, int4* out, int rows, int vecs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[2];
  __shared__ uint32_t slots[32];
  const uint32_t row_bytes = vecs * 16;
  if (threadIdx.x == 0) { barrier_init(&landed[0], 1); barrier_init(&landed[1], 1); barrier_init_fence(); }
  __syncthreads();
  for (int k = 0; k < 2; ++k) {
    const int r = blockIdx.x + k * gridDim.x;
    if (threadIdx.x == 0 && r < rows) {
      barrier_arrive_expecting(&landed[k], row_bytes);
      bulk_copy_to_shared(stages + k * row_bytes, in + (long)r * vecs, row_bytes, &landed[k]);
    }
  }
  int k = 0;
  for (int r = blockIdx.x; r < rows; r += gridDim.x, ++k) {
    const int stage = k & 1;
    barrier_wait(&landed[stage], (k >> 1) & 1);
    const int4* src = reinterpret_cast<const int4*>(stages + stage * row_bytes);
    move_row<U>(src, out + (long)r * vecs, slots, [&] {
      const int next = r + 2 * gridDim.x;
      if (threadIdx.x == 0 && next < rows) {
        barrier_arrive_expecting(&landed[stage], row_bytes);
        bulk_copy_to_shared(stages + stage * row_bytes, in + (long)next * vecs, row_bytes, &landed[stage]);
      }
    });
  }
#endif
}

// Plain copies: a grid-stride loop of U vectors a thread, or one tile a block (grid covers everything).
template <int U>
__global__ void copy_stride(const int4* in, int4* out, long n) {
  extern __shared__ char pad[];
  const long stride = (long)gridDim.x * blockDim.x * U;
  for (long base = (long)blockIdx.x * blockDim.x * U + threadIdx.x; base < n; base += stride) {
    copy_tile<U>(in + base, out + base);
  }
}

// Plain copy, persistent, each block taking the next tile from a global counter (tiles in global order).
template <int U>
__global__ void copy_ticket(const int4* in, int4* out, long n, unsigned* counter) {
  extern __shared__ char pad[];
  __shared__ unsigned tile;
  const long tiles = n / (blockDim.x * U);
  for (;;) {
    if (threadIdx.x == 0) tile = atomicAdd(counter, 1u);
    __syncthreads();
    const long t = tile;
    __syncthreads();
    if (t >= tiles) return;
    const long base = t * blockDim.x * U + threadIdx.x;
    copy_tile<U>(in + base, out + base);
  }
}

// rows_in_registers with rows taken from a global counter.
template <int U>
__global__ void rows_ticket(const int4* in, int4* out, int rows, int vecs, unsigned* counter) {
  extern __shared__ char pad[];
  __shared__ uint32_t slots[32];
  __shared__ unsigned next;
  for (;;) {
    if (threadIdx.x == 0) next = atomicAdd(counter, 1u);
    __syncthreads();
    const int r = next;
    if (r >= rows) return;
    const int4* src = in + (long)r * vecs;
    move_row<U>(src, out + (long)r * vecs, slots);
  }
}

// rows_staged with rows in global order: the sending thread draws each row from a global counter as it sends
// for it, two rows ahead, so the counter's round trip hides behind the rows in flight.
template <int U>
__global__ void rows_staged_ticket(const int4* in, int4* out, int rows, int vecs, unsigned* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ uint64_t landed[2];
  __shared__ uint32_t slots[32];
  __shared__ int row_of[2];
  const uint32_t row_bytes = vecs * 16;
  const auto send = [&](int stage) {
    const int r = static_cast<int>(atomicAdd(counter, 1u));
    row_of[stage] = r;
    if (r < rows) {
      barrier_arrive_expecting(&landed[stage], row_bytes);
      bulk_copy_to_shared(stages + stage * row_bytes, in + (long)r * vecs, row_bytes, &landed[stage]);
    }
  };
  if (threadIdx.x == 0) {
    barrier_init(&landed[0], 1); barrier_init(&landed[1], 1); barrier_init_fence();
    send(0); send(1);
  }
  __syncthreads();
  for (int k = 0;; ++k) {
    const int stage = k & 1;
    const int r = row_of[stage];
    if (r >= rows) break;
    barrier_wait(&landed[stage], (k >> 1) & 1);
    const int4* src = reinterpret_cast<const int4*>(stages + stage * row_bytes);
    move_row<U>(src, out + (long)r * vecs, slots, [&] {
      if (threadIdx.x == 0) send(stage);
    });
  }
#endif
}

// rows_in_registers, persistent, recording when each block ends and on which multiprocessor.
template <int U>
__global__ void rows_timed(const int4* in, int4* out, int rows, int vecs, unsigned long long* ends) {
  extern __shared__ char pad[];
  __shared__ uint32_t slots[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const int4* src = in + (long)r * vecs;
    move_row<U>(src, out + (long)r * vecs, slots);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long now;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    ends[2 * blockIdx.x] = now;
    ends[2 * blockIdx.x + 1] = sm;
  }
}

// A whole bf16 softmax of rows in registers (scores x * scale), one block reduction of (max, sum) pairs: grid-stride
// over rows (persistent when the grid is smaller than the rows).
__device__ __forceinline__ float2 combine(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  return make_float2(m, a.y * exp2f(a.x - m) + b.y * exp2f(b.x - m));
}
template <int U>
__global__ void __launch_bounds__(U >= 8 ? 256 : 1024)
    softmax_rows(const uint4* in, uint4* out, int rows, int vecs, float scale) {
  __shared__ float2 slots[32];
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* src = in + (long)r * vecs;
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) raw[u] = src[threadIdx.x + u * blockDim.x];
    float s[U][8];
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s[u][2 * k] = __uint_as_float(w[k] << 16) * scale;
        s[u][2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u) * scale;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, s[u][k]);
    }
    float sum = 0;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < 8; ++k) { s[u][k] = exp2f(s[u][k] - m); sum += s[u][k]; }
    float2 st = make_float2(m, sum);
    for (int o = 16; o; o >>= 1) {
      float2 other = make_float2(__shfl_xor_sync(~0u, st.x, o), __shfl_xor_sync(~0u, st.y, o));
      st = combine(st, other);
    }
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x / 32] = st;
    __syncthreads();
    float2 row = slots[0];
    for (int w = 1; w < (int)blockDim.x / 32; ++w) row = combine(row, slots[w]);
    __syncthreads();
    const float rescale = exp2f(m - row.x) / row.y;
    uint4* dst = out + (long)r * vecs;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        __nv_bfloat162 pair = __floats2bfloat162_rn(s[u][2 * k] * rescale, s[u][2 * k + 1] * rescale);
        w[k] = *reinterpret_cast<uint32_t*>(&pair);
      }
      dst[threadIdx.x + u * blockDim.x] = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

cudaEvent_t e0, e1;
unsigned* counter;
int multiprocessors;
const long kVecs = (512L << 20) / 16;

template <typename Launch>
void time_it(const char* name, Launch launch) {
  for (int w = 0; w < 3; ++w) launch();
  float best = 1e9, total = 0;
  for (int r = 0; r < 30; ++r) {
    cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); best = ms < best ? ms : best; total += ms;
  }
  cudaError_t err = cudaGetLastError();
  printf("%-44s best %7.1f us  mean %7.1f us  %5.0f GB/s %s\n", name, best * 1e3, total / 30 * 1e3,
         2.0 * kVecs * 16 / (best * 1e6), err == cudaSuccess ? "" : cudaGetErrorString(err));
}

template <typename K>
int resident(K kernel, int threads, int smem) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  return per_sm;
}

template <int U>
void rows(const int4* in, int4* out, int threads, int per_sm_wanted, bool staged) {
  const int vecs = threads * U, rows = (int)(kVecs / vecs);
  const int row_bytes = vecs * 16;
  auto kernel = staged ? rows_staged<U> : rows_in_registers<U>;
  int smem = staged ? 2 * row_bytes : 0;
  if (per_sm_wanted) smem = smem > 220 * 1024 / per_sm_wanted ? smem : 220 * 1024 / per_sm_wanted;
  const int per_sm = resident(kernel, threads, smem);
  char name[128];
  snprintf(name, sizeof name, "%s C=%d T=%d U=%d %d/SM", staged ? "staged" : "registers", vecs * 8, threads, U,
           per_sm);
  const int grid = per_sm * multiprocessors < rows ? per_sm * multiprocessors : rows;
  time_it(name, [&] { kernel<<<grid, threads, smem>>>(in, out, rows, vecs); });
}

__global__ void fill(uint32_t* p, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) & 0x3f7f3f7fu;
}

template <int U>
void tickets(const int4* in, int4* out, int threads, int per_sm) {
  const int smem = 220 * 1024 / per_sm;
  resident(copy_ticket<U>, threads, smem);
  char name[64]; snprintf(name, sizeof name, "copy ticket T=%d U=%d %d/SM", threads, U, per_sm);
  time_it(name, [&] {
    cudaMemsetAsync(counter, 0, 4);
    copy_ticket<U><<<multiprocessors * per_sm, threads, smem>>>(in, out, kVecs, counter);
  });
}

template <int U>
void tiles(const int4* in, int4* out, int threads) {
  char name[64]; snprintf(name, sizeof name, "copy tiles T=%d U=%d (one tile a block)", threads, U);
  time_it(name, [&] { copy_stride<U><<<(unsigned)(kVecs / (threads * U)), threads>>>(in, out, kVecs); });
}

// Non-persistent row skeletons held to `per_sm` blocks a multiprocessor by shared memory (0: not held).
template <int U>
void one_row_a_block(const int4* in, int4* out, int threads, int per_sm) {
  const int vecs = threads * U, row_count = (int)(kVecs / vecs);
  const int smem = per_sm ? 220 * 1024 / per_sm : 0;
  const int resident_blocks = resident(rows_in_registers<U>, threads, smem);
  char name[96];
  snprintf(name, sizeof name, "skeleton C=%d T=%d U=%d one row a block, %d/SM", vecs * 8, threads, U, resident_blocks);
  time_it(name, [&] { rows_in_registers<U><<<row_count, threads, smem>>>(in, out, row_count, vecs); });
}

template <int U>
void row_variants(const int4* in, int4* out, int threads, int per_sm) {
  const int vecs = threads * U, row_count = (int)(kVecs / vecs);
  one_row_a_block<U>(in, out, threads, 0);
  char name[96];
  const int smem = 220 * 1024 / per_sm;
  resident(rows_ticket<U>, threads, smem);
  snprintf(name, sizeof name, "registers C=%d T=%d U=%d ticket %d/SM", vecs * 8, threads, U, per_sm);
  time_it(name, [&] {
    cudaMemsetAsync(counter, 0, 4);
    rows_ticket<U><<<multiprocessors * per_sm, threads, smem>>>(in, out, row_count, vecs, counter);
  });
  rows<U>(in, out, threads, per_sm, false);
}

template <int U>
void softmax(const int4* in, int4* out, int threads) {
  const int vecs = threads * U, row_count = (int)(kVecs / vecs);
  const uint4* src = reinterpret_cast<const uint4*>(in);
  uint4* dst = reinterpret_cast<uint4*>(out);
  cudaFuncAttributes attributes;
  cudaFuncGetAttributes(&attributes, softmax_rows<U>);
  const int per_sm = resident(softmax_rows<U>, threads, 0);
  char name[96];
  snprintf(name, sizeof name, "softmax C=%d T=%d U=%d %d regs, one row a block, %d/SM", vecs * 8, threads, U,
           attributes.numRegs, per_sm);
  time_it(name, [&] { softmax_rows<U><<<row_count, threads>>>(src, dst, row_count, vecs, 0.18f); });
  snprintf(name, sizeof name, "softmax C=%d T=%d U=%d persistent %d/SM", vecs * 8, threads, U, per_sm);
  time_it(name, [&] { softmax_rows<U><<<multiprocessors * per_sm, threads>>>(src, dst, row_count, vecs, 0.18f); });
}

template <int U>
void staged_tickets(const int4* in, int4* out, int threads, int per_sm) {
  const int vecs = threads * U, row_count = (int)(kVecs / vecs);
  const int smem = std::max(2 * vecs * 16, 220 * 1024 / per_sm);
  const int resident_blocks = resident(rows_staged_ticket<U>, threads, smem);
  char name[96];
  snprintf(name, sizeof name, "staged ticket C=%d T=%d U=%d %d/SM", vecs * 8, threads, U, resident_blocks);
  time_it(name, [&] {
    cudaMemsetAsync(counter, 0, 4);
    rows_staged_ticket<U><<<multiprocessors * resident_blocks, threads, smem>>>(in, out, row_count, vecs, counter);
  });
}

// A grid-stride copy of 512 threads a block, one block a multiprocessor, on `blocks` multiprocessors, in clusters
// of `cluster` blocks.
void copy_on(const int4* in, int4* out, int blocks, int cluster) {
  const int smem = 150 * 1024;
  resident(copy_stride<8>, 512, smem);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(512);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  char name[96];
  snprintf(name, sizeof name, "copy stride T=512 U=8 on %d multiprocessors, clusters of %d", blocks, cluster);
  time_it(name, [&] { cudaLaunchKernelEx(&config, copy_stride<8>, in, out, kVecs); });
}

// When the blocks of a persistent grid end: the spread says how much a static share of rows leaves idle.
template <int U>
void block_ends(const int4* in, int4* out, int threads, int per_sm) {
  const int vecs = threads * U, row_count = (int)(kVecs / vecs);
  const int smem = 220 * 1024 / per_sm;
  resident(rows_timed<U>, threads, smem);
  const int grid = multiprocessors * per_sm;
  unsigned long long* ends;
  cudaMallocManaged(&ends, grid * 2 * sizeof(unsigned long long));
  unsigned long long start;
  for (int round = 0; round < 3; ++round) {
    cudaDeviceSynchronize();
    rows_timed<U><<<grid, threads, smem>>>(in, out, row_count, vecs, ends);
    cudaDeviceSynchronize();
    unsigned long long first = ~0ull, last = 0;
    double sum = 0;
    int first_sm = 0, last_sm = 0;
    for (int b = 0; b < grid; ++b) {
      if (ends[2 * b] < first) { first = ends[2 * b]; first_sm = (int)ends[2 * b + 1]; }
      if (ends[2 * b] > last) { last = ends[2 * b]; last_sm = (int)ends[2 * b + 1]; }
      sum += ends[2 * b];
    }
    start = first;
    printf("persistent C=%d T=%d U=%d %d/SM, %d rows a block: blocks end over %.1f us (mean %.1f us after the "
           "first; first SM %d, last SM %d)\n", vecs * 8, threads, U, per_sm, row_count / grid,
           (last - first) / 1e3, (sum / grid - start) / 1e3, first_sm, last_sm);
  }
  cudaFree(ends);
}

int main() {
  int4 *in, *out;
  cudaMalloc(&in, kVecs * 16);
  cudaMalloc(&out, kVecs * 16);
  cudaMalloc(&counter, 4);
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(in), kVecs * 4);
  cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0);
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  time_it("cudaMemcpyAsync", [&] { cudaMemcpyAsync(out, in, kVecs * 16, cudaMemcpyDeviceToDevice); });
  time_it("memset alone (4 bytes)", [&] { cudaMemsetAsync(counter, 0, 4); });
  // Plain copies: persistent on some or all multiprocessors; one tile a block; tiles drawn in order.
  copy_on(in, out, 120, 1);
  copy_on(in, out, multiprocessors, 1);
  copy_on(in, out, 120, 8);
  for (int per_sm : {1, 2, 4, 8}) {
    const int smem = 220 * 1024 / per_sm;
    resident(copy_stride<8>, 256, smem);
    char name[64];
    snprintf(name, sizeof name, "copy stride T=256 U=8 %d/SM", per_sm);
    time_it(name, [&] { copy_stride<8><<<multiprocessors * per_sm, 256, smem>>>(in, out, kVecs); });
  }
  tiles<1>(in, out, 256);
  tiles<2>(in, out, 128);
  tiles<4>(in, out, 64);
  tiles<4>(in, out, 128);
  tiles<4>(in, out, 256);
  tiles<8>(in, out, 128);
  tiles<8>(in, out, 256);
  tickets<4>(in, out, 128, 16);
  tickets<4>(in, out, 256, 8);
  tickets<8>(in, out, 256, 4);
  tickets<8>(in, out, 512, 2);
  // Row skeletons: one row a block, rows drawn in order, persistent; staged persistent, staged drawn in order.
  row_variants<4>(in, out, 512, 2);
  row_variants<4>(in, out, 512, 3);
  row_variants<2>(in, out, 1024, 2);
  row_variants<8>(in, out, 256, 4);
  row_variants<4>(in, out, 128, 8);
  for (int per_sm : {2, 3}) rows<4>(in, out, 512, per_sm, true);
  for (int per_sm : {2, 3}) staged_tickets<4>(in, out, 512, per_sm);
  staged_tickets<2>(in, out, 1024, 2);
  // One row a block, held to n blocks a multiprocessor.
  for (int per_sm : {1, 2, 3, 4}) one_row_a_block<4>(in, out, 512, per_sm);
  for (int per_sm : {1, 2}) one_row_a_block<2>(in, out, 1024, per_sm);
  for (int per_sm : {2, 4, 8}) one_row_a_block<8>(in, out, 256, per_sm);
  for (int per_sm : {4, 8, 16}) one_row_a_block<4>(in, out, 128, per_sm);
  // A whole softmax, one row a block and persistent.
  softmax<1>(in, out, 1024);
  softmax<2>(in, out, 1024);
  softmax<4>(in, out, 512);
  softmax<8>(in, out, 256);
  softmax<4>(in, out, 128);
  block_ends<4>(in, out, 512, 2);
  block_ends<2>(in, out, 1024, 2);
  block_ends<4>(in, out, 128, 8);
  return 0;
}
