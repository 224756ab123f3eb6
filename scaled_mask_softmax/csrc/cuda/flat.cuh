// The backward of short rows that start mid-vector, taken as flat runs: where y's, dy's and dx's rows are contiguous,
// the elements of a run of consecutive rows (as many as make whole vectors from a vector boundary) are read and
// written as whole 16-byte vectors, however the rows fall in them, and each row's sum gathered from the vectors that
// hold it; a learnable bias's gradient is summed in the same vectors. The register kernels read such rows from the
// vector boundary before each row's start, masking what lies outside the row, and store the partial vectors at its
// ends in pieces: at 49 bf16 columns flat runs take 9-14% less time (benchmarks/NOTES.md, v122). The forward's flat
// runs were slower than the register kernels with most masks, and at 97 columns with every one (v119); the causal
// backward's at 97 columns too (v120).
#pragma once

#include <algorithm>
#include <numeric>

#include <ATen/OpMathType.h>

#include "../binding.h"
#include "alignment.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"

namespace sms {

// Blocks of the flat runs: each warp takes runs of its own, with no barrier but its own (__syncwarp).
constexpr int kFlatThreads = 128;
constexpr int kFlatWarps = kFlatThreads / kWarp;

// A run's vectors a lane holds: kFlatIters where the run fits (runs are doubled up to it), kFlatMaxIters at most.
constexpr int kFlatIters = 2;
constexpr int kFlatMaxIters = 4;

// __launch_bounds__'s blocks a multiprocessor for a kernel of ITERS vectors a lane: at kFlatIters, 7 (at most 73
// registers a thread, 28 warps a multiprocessor); at kFlatMaxIters, 1.
template <int ITERS>
constexpr int kFlatMinBlocks = ITERS <= kFlatIters ? 7 : 1;

// backward_flat_with_bias_grad's, whose sums take a register an element of a lane's vectors: at kFlatIters, 5 (at
// most 102 registers a thread).
template <int ITERS>
constexpr int kFlatBiasGradMinBlocks = ITERS <= kFlatIters ? 5 : 1;

// Rows of at most this many vectors take flat runs: where a row is a few vectors, its partial vectors are much of it.
constexpr int64_t kFlatMaxVectors = 16;

// A run's rows, reduced in shared memory: each lane writes the sum of the parts of its vectors that lie in the row of
// their first element and in the row after it; the lane of each row adds the row's parts in column order (so that a
// row's sum is the same from run to run), and every lane reads back its rows' sums.
template <int kSlots>
struct FlatRunSlots {
  float first[kSlots];   // the part of vector j in the row of its first element
  float second[kSlots];  // the part of vector j in the row after it (its elements from `split` on)
  float row[kSlots];     // one a row of the run: a run has at most one row a vector
};

// A launch's runs: how many it visits (a warp's each), the rows and vectors of each, and the row length as a divisor.
struct FlatRuns {
  int64_t count;
  int rows;
  int vectors;
  Divisor columns;
};

// One warp's run: the row of the run in which each of a lane's ITERS vectors starts, the element at which the row
// after it starts (`split`, VEC or more where the vector ends in its first row), and the rows' sums.
template <int VEC, int ITERS>
struct FlatRun {
  static constexpr int kSlots = kWarp * ITERS;
  FlatRunSlots<kSlots>& slots;
  int lane;
  int rows;
  int vectors;
  int cols;
  int row_of[ITERS];
  int column[ITERS];
  int split[ITERS];

  __device__ __forceinline__ FlatRun(FlatRunSlots<kSlots>& run_slots, const FlatRuns& runs, int row_length)
      : slots(run_slots), lane(static_cast<int>(threadIdx.x % kWarp)), rows(runs.rows), vectors(runs.vectors),
        cols(row_length) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      row_of[i] = static_cast<int>(runs.columns.small_quotient(offset(i)));
      column[i] = offset(i) - row_of[i] * cols;
      split[i] = cols - column[i];
    }
  }

  // The run's element at which vector i starts. A lane's vectors past the run are the run's last again, which no row
  // reads from them and none stores.
  __device__ __forceinline__ int offset(int i) const { return min(lane + kWarp * i, vectors - 1) * VEC; }
  __device__ __forceinline__ bool stored(int i) const { return lane + kWarp * i < vectors; }
  // The row after vector i's first: the run's last row again where the vector ends in its first.
  __device__ __forceinline__ int next_row(int i) const { return min(row_of[i] + 1, rows - 1); }

  // Each row's sum of its parts (first[i] and second[i] of vector i), back into first and second. The next call's
  // writes wait for this call's reads at its first __syncwarp.
  __device__ __forceinline__ void sum_rows(float (&first)[ITERS], float (&second)[ITERS]) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      slots.first[lane + kWarp * i] = first[i];
      slots.second[lane + kWarp * i] = second[i];
    }
    __syncwarp();
    for (int r = lane; r < rows; r += kWarp) slots.row[r] = row_sum(r);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      first[i] = slots.row[row_of[i]];
      second[i] = slots.row[next_row(i)];
    }
  }

  // Row r's sum: the second part of the vector where the row starts mid-vector, then the first parts of the vectors
  // after it.
  __device__ __forceinline__ float row_sum(int r) const {
    const int begin = r * cols;
    const int first = begin / VEC;
    const int last = (begin + cols - 1) / VEC;
    float sum = begin % VEC == 0 ? slots.first[first] : slots.second[first];
    for (int j = first + 1; j <= last; ++j) sum += slots.first[j];
    return sum;
  }
};

// The gradient of the run of y's, dy's and dx's rows that starts at element `start` of each: each element's dx is
// gradient(i, v, y, dy, row_dot), that of element v of the lane's vector i.
template <typename scalar_t, int VEC, int ITERS, typename Gradient>
__device__ __forceinline__ void run_gradient(FlatRun<VEC, ITERS>& run, const BackwardParams& p, int64_t start,
                                             Gradient&& gradient) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(std::is_same_v<acc_t, float>, "flat runs sum fp32 parts");
  const scalar_t* const y = static_cast<const scalar_t*>(p.y) + start;
  const scalar_t* const dy = static_cast<const scalar_t*>(p.dy) + start;
  scalar_t* const dx = static_cast<scalar_t*>(p.dx) + start;
  // Every load issued before any is used.
  Vector<scalar_t, VEC> raw_y[ITERS], raw_dy[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    raw_y[i] = load_vector<VEC>(y, run.offset(i));
    raw_dy[i] = load_vector<VEC>(dy, run.offset(i));
  }
  acc_t y_values[ITERS][VEC], dy_values[ITERS][VEC];
  acc_t first[ITERS], second[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    widen(raw_y[i], y_values[i]);
    widen(raw_dy[i], dy_values[i]);
    first[i] = 0;
    second[i] = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if (v < run.split[i]) {
        first[i] += y_values[i][v] * dy_values[i][v];
      } else {
        second[i] += y_values[i][v] * dy_values[i][v];
      }
    }
  }
  run.sum_rows(first, second);
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    acc_t dx_values[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      dx_values[v] = gradient(i, v, y_values[i][v], dy_values[i][v], v < run.split[i] ? first[i] : second[i]);
    }
    if (run.stored(i)) store_vector<VEC, /*kEvictFirst=*/false>(dx, run.offset(i), dx_values);
  }
}

// Calls visit(visit_index, run) for each of `runs.count` visits, a warp's at a time, each warp with its own slots.
template <int VEC, int ITERS, typename Visit>
__device__ __forceinline__ void for_each_run(const FlatRuns& runs, int cols, Visit&& visit) {
  __shared__ FlatRunSlots<kWarp * ITERS> warp_slots[kFlatWarps];
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * kFlatWarps + threadIdx.x / kWarp; index < runs.count;
       index += static_cast<int64_t>(gridDim.x) * kFlatWarps) {
    FlatRun<VEC, ITERS> run(warp_slots[threadIdx.x / kWarp], runs, cols);
    visit(index, run);
  }
}

// dx = scale * y * (dy - sum(dy * y)) over short rows that start mid-vector, whose y, dy and dx are contiguous from
// 16-byte boundaries, with no causal limit: a warp takes a run of `runs.rows` rows at a time, whole vectors, at most
// kWarp * ITERS.
template <typename scalar_t, int VEC, int ITERS>
__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocks<ITERS>)
    backward_flat(const BackwardParams p, const FlatRuns runs) {
  using acc_t = at::opmath_type<scalar_t>;
  const int cols = static_cast<int>(p.cols);
  const acc_t scale = static_cast<acc_t>(p.scale);
  for_each_run<VEC, ITERS>(runs, cols, [&](int64_t visit, FlatRun<VEC, ITERS>& run) {
    run_gradient<scalar_t>(run, p, visit * runs.rows * cols,
                           [&](int, int, acc_t y, acc_t dy, acc_t row_dot) { return scale * y * (dy - row_dot); });
  });
}

// backward_flat, a learnable bias's gradient summed with dx (as backward_with_bias_grad): p.bias_rows is a period of
// the bias's rows that whole runs fill (launch_backward_flat_with_bias_grad), so that a run's rows take the same
// bias rows in every period, and its sums lie a whole number of vectors into the period's. Each warp takes a run of
// one part's periods (runs.count: the runs of all parts' periods), adding its score gradients y * (dy - row_dot) in
// registers, and stores the sums once, as whole vectors.
template <typename scalar_t, int VEC, int ITERS>
__global__ void __launch_bounds__(kFlatThreads, kFlatBiasGradMinBlocks<ITERS>)
    backward_flat_with_bias_grad(const BackwardParams p, const FlatRuns runs) {
  using acc_t = at::opmath_type<scalar_t>;
  const int cols = static_cast<int>(p.cols);
  const acc_t scale = static_cast<acc_t>(p.scale);
  const int64_t periods = p.bias_rows.quotient(p.rows);
  for_each_run<VEC, ITERS>(runs, cols, [&](int64_t group, FlatRun<VEC, ITERS>& run) {
    int64_t period_row;
    const int64_t first_period = p.bias_rows.quotient(group * runs.rows, period_row) * p.rows_per_part;
    const int64_t last_period = first_period + p.rows_per_part < periods ? first_period + p.rows_per_part : periods;
    acc_t sums[ITERS][VEC] = {};
    for (int64_t period = first_period; period < last_period; ++period) {
      run_gradient<scalar_t>(run, p, (period * p.bias_rows.value + period_row) * cols,
                             [&](int i, int v, acc_t y, acc_t dy, acc_t row_dot) {
                               const acc_t score_grad = y * (dy - row_dot);
                               sums[i][v] += score_grad;
                               return scale * score_grad;
                             });
    }
    acc_t* const bias_grad = static_cast<acc_t*>(p.bias_grad) + group * runs.rows * cols;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      if (run.stored(i)) store_vector<VEC, /*kEvictFirst=*/false>(bias_grad, run.offset(i), sums[i]);
    }
  });
}

// The rows of each run: the fewest that make whole vectors (VEC / gcd(cols, VEC)), at most kFlatMaxIters vectors a
// lane, doubled while the run stays within kFlatIters vectors a lane and divides the rows; 0 where these rows take
// no flat runs.
inline int flat_run_rows(int64_t rows, int64_t cols, int vec) {
  if (cols < vec || cols % vec == 0 || cols > kFlatMaxVectors * vec) return 0;
  int64_t run_rows = vec / std::gcd(cols, int64_t{vec});
  if (rows % run_rows != 0 || run_rows * cols / vec > kWarp * kFlatMaxIters) return 0;
  while (rows % (2 * run_rows) == 0 && 2 * run_rows * cols / vec <= kWarp * kFlatIters) run_rows *= 2;
  return static_cast<int>(run_rows);
}

// The runs of `rows` rows of `cols` elements (flat_run_rows); none (count 0) where flat runs do not take them.
inline FlatRuns flat_runs(int64_t rows, int64_t cols, int vec) {
  const int run_rows = flat_run_rows(rows, cols, vec);
  if (run_rows == 0) return {0, 0, 0, Divisor()};
  return {rows / run_rows, run_rows, static_cast<int>(run_rows * cols / vec), Divisor(cols)};
}

// Whether an operand's rows are contiguous from a 16-byte boundary, as flat runs read them.
inline bool rows_contiguous(const void* data, const RowStrides& strides, const RowShape& shape, int64_t cols) {
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return false;
  const RowStrides contiguous = contiguous_row_strides(shape, cols);
  for (int d = 0; d < shape.dims; ++d) {
    if (shape.size[d].value > 1 && strides.stride[d] != contiguous.stride[d]) return false;
  }
  return true;
}

// Calls launch(iters) with the vectors a lane of a run's warp holds: kFlatIters where the run fits.
template <typename Launch>
void with_flat_iters(const FlatRuns& runs, Launch&& launch) {
  if (runs.vectors <= kWarp * kFlatIters) {
    launch(std::integral_constant<int, kFlatIters>{});
  } else {
    launch(std::integral_constant<int, kFlatMaxIters>{});
  }
}

// The blocks of a flat-run kernel for runs.count visits, a warp's each.
inline unsigned flat_blocks(const FlatRuns& runs) {
  return static_cast<unsigned>(std::min(ceil_div(runs.count, int64_t{kFlatWarps}), kMaxBlocks));
}

// Whether p's rows take flat runs in the backward: no causal limit, and y's, dy's and dx's rows contiguous from
// 16-byte boundaries.
inline bool backward_takes_flat_runs(const BackwardParams& p) {
  return !p.is_causal && rows_contiguous(p.y, p.y_strides, p.shape, p.cols) &&
         rows_contiguous(p.dy, p.dy_strides, p.shape, p.cols) &&
         rows_contiguous(p.dx, contiguous_row_strides(p.shape, p.cols), p.shape, p.cols);
}

// Launches backward_flat where p's rows make flat runs (backward_takes_flat_runs); false otherwise, and for fp64.
template <typename scalar_t, int VEC>
bool launch_backward_flat(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4 || VEC * sizeof(scalar_t) != 16) {
    return false;
  } else {
    const FlatRuns runs = flat_runs(p.rows, p.cols, VEC);
    if (runs.count == 0 || !backward_takes_flat_runs(p)) return false;
    with_flat_iters(runs, [&](auto iters) {
      backward_flat<scalar_t, VEC, decltype(iters)::value><<<flat_blocks(runs), kFlatThreads, 0, stream>>>(p, runs);
    });
    return true;
  }
}

// Launches backward_flat_with_bias_grad where p's rows make flat runs, with parts enough of the bias's periods for
// the warps to fill the device; their sums into `sums`, [parts, bias_rows, cols] (the bias gradient their sum over
// parts: bias_grad_of_parts). False otherwise, and for fp64.
template <typename scalar_t, int VEC>
bool launch_backward_flat_with_bias_grad(const at::Tensor& y, int64_t bias_rows, const BackwardParams& p,
                                         at::Tensor& sums, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4 || VEC * sizeof(scalar_t) != 16) {
    return false;
  } else {
    const FlatRuns runs = flat_runs(p.rows, p.cols, VEC);
    if (runs.count == 0 || !backward_takes_flat_runs(p)) return false;
    // Both divide the rows, and so does their least common multiple: runs tile each period of that many rows, and
    // the bias's rows tile it too. Its sums are those of period / bias_rows parts of the bias's rows.
    const int64_t period = std::lcm(int64_t{runs.rows}, bias_rows);
    with_flat_iters(runs, [&](auto iters) {
      const auto kernel = backward_flat_with_bias_grad<scalar_t, VEC, decltype(iters)::value>;
      const int64_t resident_warps = int64_t{resident_blocks(kernel, kFlatThreads)} *
                                     device_attribute(cudaDevAttrMultiProcessorCount) * kFlatWarps;
      BackwardParams params = p;
      sums = make_bias_grad_parts(y, period, resident_warps * runs.rows, params).view({-1, bias_rows, p.cols});
      FlatRuns groups = runs;
      groups.count = params.bias_grad_rows / runs.rows;
      kernel<<<flat_blocks(groups), kFlatThreads, 0, stream>>>(params, groups);
    });
    return true;
  }
}

}  // namespace sms
