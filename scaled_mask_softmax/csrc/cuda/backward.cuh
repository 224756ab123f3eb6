// The backward engine: dx = scale * y * (dy - sum(dy * y)) over each row, from the saved output y alone.
#pragma once

#include <ATen/OpMathType.h>

#include "../params.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"

namespace sms {

template <typename scalar_t>
struct GradientRow {
  const scalar_t* y;
  const scalar_t* dy;
  scalar_t* dx;

  __device__ GradientRow(const BackwardParams& p, int64_t row) {
    int64_t y_start, dy_start;
    row_starts(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
    y = static_cast<const scalar_t*>(p.y) + y_start;
    dy = static_cast<const scalar_t*>(p.dy) + dy_start;
    dx = static_cast<scalar_t*>(p.dx) + row * p.cols;
  }
};

// Row in registers (y and dy both): `width` threads per row, ITERS vectors of VEC elements each.
template <typename scalar_t, int VEC, int ITERS>
__global__ void __launch_bounds__(max_threads_for(ITERS * registers_per_vector<at::opmath_type<scalar_t>>(VEC, 2)))
    backward_in_registers(const BackwardParams p, const int width) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[kWarp];
  const acc_t scale = static_cast<acc_t>(p.scale);
  const int rows_per_block = blockDim.x / width;
  const int lane = threadIdx.x % width;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / width; row < p.rows;
       row += static_cast<int64_t>(gridDim.x) * rows_per_block) {
    const GradientRow<scalar_t> g(p, row);
    acc_t y[ITERS][VEC], dy[ITERS][VEC];
    acc_t local_dot = 0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int64_t col = (static_cast<int64_t>(i) * width + lane) * VEC;
      load_vector<VEC>(g.y, col, p.cols, acc_t(0), y[i]);
      load_vector<VEC>(g.dy, col, p.cols, acc_t(0), dy[i]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) local_dot += y[i][v] * dy[i][v];
    }
    const acc_t dot = row_reduce(local_dot, SumOp(), acc_t(0), width, shared);
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) y[i][v] = scale * y[i][v] * (dy[i][v] - dot);
      store_vector<VEC>(g.dx, (static_cast<int64_t>(i) * width + lane) * VEC, p.cols, y[i]);
    }
  }
}

// Rows of any length: one block per row; pass 1 sums dy * y, pass 2 reads both again and writes dx.
template <typename scalar_t, int VEC>
__global__ void __launch_bounds__(kLongRowThreads) backward_two_pass(const BackwardParams p) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[kWarp];
  const acc_t scale = static_cast<acc_t>(p.scale);
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const GradientRow<scalar_t> g(p, row);
    acc_t local_dot = 0;
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < p.cols; col += step) {
      acc_t y[VEC], dy[VEC];
      load_vector<VEC>(g.y, col, p.cols, acc_t(0), y);
      load_vector<VEC>(g.dy, col, p.cols, acc_t(0), dy);
#pragma unroll
      for (int v = 0; v < VEC; ++v) local_dot += y[v] * dy[v];
    }
    const acc_t dot = row_reduce(local_dot, SumOp(), acc_t(0), blockDim.x, shared);
    for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < p.cols; col += step) {
      acc_t y[VEC], dy[VEC];
      load_vector<VEC>(g.y, col, p.cols, acc_t(0), y);
      load_vector<VEC>(g.dy, col, p.cols, acc_t(0), dy);
#pragma unroll
      for (int v = 0; v < VEC; ++v) y[v] = scale * y[v] * (dy[v] - dot);
      store_vector<VEC>(g.dx, col, p.cols, y);
    }
  }
}

}  // namespace sms
