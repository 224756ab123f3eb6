// The backward engine: dx = scale * y * (dy - sum(dy * y)) over each row, from the saved output y alone.
#pragma once

#include <ATen/OpMathType.h>

#include "../params.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"

namespace sms {

// One row of y, dy and dx; y and dy are held as loaded (16-bit types stay packed, half the registers).
// kCausal: the row has a causal limit, past which nothing is read and dx is 0. Without one the per-vector checks
// are left out at compile time: they cost the 16-bit backward registers and 5-15% of its speed.
template <typename scalar_t, int VEC, bool kCausal>
struct GradientRow {
  using acc_t = at::opmath_type<scalar_t>;
  struct Raw {
    Vector<scalar_t, VEC> y, dy;
  };

  const scalar_t* y;
  const scalar_t* dy;
  scalar_t* dx;
  int64_t cols;
  int64_t visible_end;
  acc_t scale;

  __device__ GradientRow(const BackwardParams& p, int64_t row)
      : cols(p.cols), visible_end(kCausal ? sms::visible_end(p, row) : p.cols), scale(static_cast<acc_t>(p.scale)) {
    int64_t y_start, dy_start;
    row_starts(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
    y = static_cast<const scalar_t*>(p.y) + y_start;
    dy = static_cast<const scalar_t*>(p.dy) + dy_start;
    dx = static_cast<scalar_t*>(p.dx) + row * p.cols;
  }

  // Keys past the visible ones are never read.
  __device__ __forceinline__ void fetch(int64_t col, Raw& raw) const {
    if (col < visible_end) {
      raw.y = load_vector<VEC>(y, col);
      raw.dy = load_vector<VEC>(dy, col);
    }
  }

  // How many of the vector's elements at `col` are visible: VEC or more for all but the one the limit cuts.
  __device__ __forceinline__ int64_t visible_in(int64_t col) const { return visible_end - col; }

  __device__ __forceinline__ acc_t product(const Raw& raw, int v) const {
    return static_cast<acc_t>(raw.y.element[v]) * static_cast<acc_t>(raw.dy.element[v]);
  }

  __device__ __forceinline__ acc_t dot(int64_t col, const Raw& raw) const {
    const int64_t visible = visible_in(col);
    if (visible <= 0) return 0;
    acc_t sum = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if (!kCausal || visible >= VEC || v < visible) sum += product(raw, v);
    }
    return sum;
  }

  // Hidden keys get 0, whatever their (unread) y holds.
  __device__ __forceinline__ void store_gradient(int64_t col, const Raw& raw, acc_t row_dot) const {
    if (col >= cols) return;
    acc_t dx_values[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      dx_values[v] = scale * static_cast<acc_t>(raw.y.element[v]) * (static_cast<acc_t>(raw.dy.element[v]) - row_dot);
    }
    const int64_t visible = visible_in(col);
    if (kCausal && visible < VEC) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        if (v >= visible) dx_values[v] = 0;
      }
    }
    store_vector<VEC>(dx, col, dx_values);
  }
};

// Row in registers: `tiling.width` threads per row (a group of lanes, or the whole block), ITERS vectors of VEC
// elements of y and of dy each, or with kCluster a slice of such blocks per row for `tiling.blocks_per_row`
// blocks of a cluster; one reduction, one read of y and dy, one write of dx.
template <typename scalar_t, int VEC, int ITERS, bool kCausal, bool kCluster>
__global__ void __launch_bounds__(max_threads_for(ITERS * registers_for<scalar_t>(VEC, 2)))
    backward_in_registers(const BackwardParams p, const RowTiling tiling) {
  using Row = GradientRow<scalar_t, VEC, kCausal>;
  using acc_t = typename Row::acc_t;
  // A slot per warp, and one the blocks of a cluster read from each other.
  __shared__ acc_t shared[kWarp + 1];
  const RowCover cover(kCluster ? tiling : RowTiling{tiling.width, 1}, ITERS * VEC);
  for (int64_t row = cover.first_row(); row < p.rows; row += cover.row_step()) {
    const Row g(p, row);
    typename Row::Raw raw[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) g.fetch(cover.column(i, VEC), raw[i]);
    acc_t local_dot = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) local_dot += g.dot(cover.column(i, VEC), raw[i]);
    acc_t row_dot = row_reduce(local_dot, SumOp(), acc_t(0), tiling.width, shared);
    if constexpr (kCluster) row_dot = cluster_reduce(row_dot, SumOp(), shared + kWarp, tiling.blocks_per_row);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) g.store_gradient(cover.column(i, VEC), raw[i], row_dot);
  }
}

// Rows of any length: one block per row; pass 1 sums dy * y, pass 2 reads both again and writes dx; kUnroll
// vectors per thread in flight.
template <typename scalar_t, int VEC, bool kCausal>
__global__ void __launch_bounds__(kLongRowThreads) backward_two_pass(const BackwardParams p) {
  using Row = GradientRow<scalar_t, VEC, kCausal>;
  using acc_t = typename Row::acc_t;
  __shared__ acc_t shared[kWarp];
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const Row g(p, row);
    acc_t local_dot = 0;
    for (int64_t base = static_cast<int64_t>(threadIdx.x) * VEC; base < g.visible_end; base += kUnroll * step) {
      typename Row::Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) g.fetch(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) local_dot += g.dot(base + u * step, raw[u]);
    }
    const acc_t row_dot = row_reduce(local_dot, SumOp(), acc_t(0), blockDim.x, shared);
    for (int64_t base = static_cast<int64_t>(threadIdx.x) * VEC; base < p.cols; base += kUnroll * step) {
      typename Row::Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) g.fetch(base + u * step, raw[u]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) g.store_gradient(base + u * step, raw[u], row_dot);
    }
  }
}

}  // namespace sms
