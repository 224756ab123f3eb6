// The forward engine: y = softmax(scale * x + mask) over each row, scale, mask and causal limit applied as the
// row is loaded, accumulated in fp32 (fp64 for fp64).
#pragma once

#include <ATen/OpMathType.h>

#include "../params.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"

namespace sms {

template <typename T>
__device__ __forceinline__ T exp_of(T v);
// ex2.approx (2 ulp) after one multiply: the score precision is what limits fp32 accuracy, not this. The .ftz
// form flushes results below 2^-126 to 0 (terms that no sum holding the row's max, 1, can see) and saves
// __expf's three instructions a call that keep subnormal results.
template <>
__device__ __forceinline__ float exp_of(float v) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(v * 1.4426950408889634f));
  return result;
}
template <>
__device__ __forceinline__ double exp_of(double v) { return exp(v); }

// bf16 rows without a mask, four vectors a thread: the scores are formed from the row as loaded once for the max
// and again for the exponentials, instead of being held in fp32 across the max's reduction. That fits the kernel
// in 64 registers, which doubles the warps per multiprocessor (benchmarks/NOTES.md, v5: 1.32 -> 1.22 of the floor
// at 1024 columns, 2.04 -> 1.58 at 16384). fp16, and rows with a mask, measured slower this way.
template <typename scalar_t, typename mask_t, int VEC, int ITERS>
constexpr bool kReformsScores =
    std::is_same_v<scalar_t, c10::BFloat16> && !has_mask_v<mask_t> && VEC == 8 && ITERS == 4;

template <typename scalar_t, int VEC, int ITERS>
constexpr int forward_max_threads = max_threads_for(ITERS * registers_for<at::opmath_type<scalar_t>>(VEC, 1));

// Row in registers: `width` threads per row (a group of lanes, or the whole block), ITERS vectors of VEC
// elements each; two reductions (max, sum), one read of x and mask, one write of y.
template <typename scalar_t, typename mask_t, int VEC, int ITERS>
__global__ void __launch_bounds__(forward_max_threads<scalar_t, VEC, ITERS>,
                                  // As many blocks as leave each thread 64 of the 65,536 registers.
                                  kReformsScores<scalar_t, mask_t, VEC, ITERS>
                                      ? 65536 / (64 * forward_max_threads<scalar_t, VEC, ITERS>)
                                      : 1) forward_in_registers(const ForwardParams p, const int width) {
  using acc_t = at::opmath_type<scalar_t>;
  using Loader = ScoreLoader<scalar_t, mask_t, acc_t, VEC>;
  constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
  __shared__ acc_t shared[kWarp];
  const RowCover cover(width);
  auto column = [&](int i) { return cover.column(i, VEC); };
  for (int64_t row = cover.first_row(); row < p.rows; row += cover.row_step()) {
    const Loader loader(p, row);
    typename Loader::Raw raw[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) loader.fetch(column(i), raw[i]);
    acc_t s[ITERS][VEC];
    acc_t local_max = kMasked;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      loader.scores(column(i), raw[i], s[i]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) local_max = MaxOp()(local_max, s[i][v]);
    }
    if constexpr (kReformsScores<scalar_t, mask_t, VEC, ITERS>) {
#pragma unroll
      for (int i = 0; i < ITERS; ++i) Loader::reform_after(raw[i]);
    }
    const acc_t row_max = row_reduce(local_max, MaxOp(), kMasked, width, shared);
    // A fully masked row (max -inf) shifts by 0, sums to 0 and is written as zeros.
    const acc_t shift = row_max == kMasked ? acc_t(0) : row_max;
    acc_t local_sum = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      if constexpr (kReformsScores<scalar_t, mask_t, VEC, ITERS>) loader.scores(column(i), raw[i], s[i]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        s[i][v] = exp_of(s[i][v] - shift);
        local_sum += s[i][v];
      }
    }
    const acc_t sum = row_reduce(local_sum, SumOp(), acc_t(0), width, shared);
    const acc_t inverse = sum == acc_t(0) ? acc_t(0) : acc_t(1) / sum;
    scalar_t* y = static_cast<scalar_t*>(p.y) + row * p.cols;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int64_t col = column(i);
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[i][v] *= inverse;
      if (col < p.cols) store_vector<VEC>(y, col, s[i]);
    }
  }
}

// A row's (or a slice's) max, and its sum of exponentials shifted by that max (by 0 while the max is -inf).
template <typename acc_t>
struct SoftmaxStats {
  acc_t max;
  acc_t sum;

  // The sum shifted by `row_max` instead, row_max >= max. An all-masked part adds its sum as it is: 0, or NaN.
  __device__ __forceinline__ acc_t sum_shifted_to(acc_t row_max) const {
    return max == -std::numeric_limits<acc_t>::infinity() ? sum : sum * exp_of(max - row_max);
  }
};

struct MergeStats {
  template <typename acc_t>
  __device__ __forceinline__ SoftmaxStats<acc_t> operator()(const SoftmaxStats<acc_t>& a,
                                                            const SoftmaxStats<acc_t>& b) const {
    const acc_t max = fmax(a.max, b.max);
    return {max, a.sum_shifted_to(max) + b.sum_shifted_to(max)};
  }
};

// Rows beyond one block's registers, in two passes over slices of the row: one slice for each of the
// `blocks_per_row` blocks of a cluster (or the whole row for a lone block). Pass 1 keeps a running max and a sum
// of exponentials rescaled to it; the slices' figures are merged through distributed shared memory; pass 2 reads
// the slice again, from L2 while slices are small, and writes y. kUnroll vectors per thread are loaded before
// any is used, to keep enough bytes in flight.
template <typename scalar_t, typename mask_t, int VEC>
__global__ void __launch_bounds__(kLongRowThreads) forward_two_pass(const ForwardParams p, const int blocks_per_row) {
  using acc_t = at::opmath_type<scalar_t>;
  using Loader = ScoreLoader<scalar_t, mask_t, acc_t, VEC>;
  constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
  __shared__ acc_t shared[kWarp];
  __shared__ ClusterExchange<SoftmaxStats<acc_t>, kMaxClusterBlocks> exchange;
  const RowSlice slice(p.cols, VEC, blocks_per_row);
  if (blocks_per_row > 1) exchange.start();
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  const int64_t first = slice.begin + static_cast<int64_t>(threadIdx.x) * VEC;
  int round = 0;
  for (int64_t row = slice.first_row(); row < p.rows; row += slice.row_step()) {
    Loader loader(p, row);
    loader.clip(slice.end);
    // Tiles starting at or before this lie wholly before the visible end: no checks per vector.
    const int64_t last_whole_tile = loader.visible_end - (kUnroll - 1) * step - VEC;
    acc_t local_max = kMasked;
    acc_t local_sum = 0;
    auto add_scores = [&](const acc_t (&s)[VEC]) {
      acc_t vector_max = kMasked;
#pragma unroll
      for (int v = 0; v < VEC; ++v) vector_max = MaxOp()(vector_max, s[v]);
      if (vector_max > local_max) {
        local_sum *= exp_of(local_max - vector_max);
        local_max = vector_max;
      }
      // Shifting by 0 while everything so far is masked keeps a NaN score NaN instead of dropping it.
      const acc_t shift = local_max == kMasked ? acc_t(0) : local_max;
#pragma unroll
      for (int v = 0; v < VEC; ++v) local_sum += exp_of(s[v] - shift);
    };
    int64_t base = first;
#pragma unroll 1
    for (; base <= last_whole_tile; base += kUnroll * step) {
      typename Loader::Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) loader.load(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc_t s[VEC];
        loader.visible_scores(raw[u], s);
        add_scores(s);
      }
    }
    if (base < loader.visible_end) {
      // Zeroed first: partly assigned, an array of structs of 16-bit class members went to local memory.
      typename Loader::Raw raw[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) loader.fetch(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc_t s[VEC];
        loader.scores(base + u * step, raw[u], s);
        add_scores(s);
      }
    }
    SoftmaxStats<acc_t> stats;
    stats.max = row_reduce(local_max, MaxOp(), kMasked, blockDim.x, shared);
    stats.sum = row_reduce(SoftmaxStats<acc_t>{local_max, local_sum}.sum_shifted_to(stats.max), SumOp(), acc_t(0),
                           blockDim.x, shared);
    if (blocks_per_row > 1) stats = exchange.reduce(stats, MergeStats(), blocks_per_row, round++);
    const acc_t shift = stats.max == kMasked ? acc_t(0) : stats.max;
    const acc_t inverse = stats.sum == acc_t(0) ? acc_t(0) : acc_t(1) / stats.sum;
    scalar_t* y = static_cast<scalar_t*>(p.y) + row * p.cols;
    auto store_probabilities = [&](int64_t col, acc_t (&s)[VEC]) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[v] = exp_of(s[v] - shift) * inverse;
      if (col < slice.end) store_vector<VEC>(y, col, s);
    };
    base = first;
#pragma unroll 1
    for (; base <= last_whole_tile; base += kUnroll * step) {
      typename Loader::Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) loader.load(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc_t s[VEC];
        loader.visible_scores(raw[u], s);
        store_probabilities(base + u * step, s);
      }
    }
    if (base < loader.visible_end) {
      typename Loader::Raw raw[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) loader.fetch(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc_t s[VEC];
        loader.scores(base + u * step, raw[u], s);
        store_probabilities(base + u * step, s);
      }
      base += kUnroll * step;
    }
    store_zeros<VEC>(y, base, slice.end, step);
  }
  if (blocks_per_row > 1) exchange.finish();
}

}  // namespace sms
