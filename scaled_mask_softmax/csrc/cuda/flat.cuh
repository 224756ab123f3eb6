// The backward of short rows that start mid-vector, taken as flat runs: where y's, dy's and dx's rows are contiguous,
// the elements of a run of consecutive rows (as many as make whole vectors from a vector boundary) are read and
// written as whole 16-byte vectors, however the rows fall in them, and each row's sum gathered from the vectors that
// hold it. The register kernels read such rows from the vector boundary before each row's start, masking what lies
// outside the row, and store the partial vectors at its ends in pieces: at 49 bf16 columns flat runs take 9-14% less
// time (benchmarks/NOTES.md, v122). The forward's flat runs were slower than the register kernels with most masks,
// and at 97 columns with every one (v119); the causal backward's at 97 columns too (v120).
#pragma once

#include <numeric>

#include <ATen/OpMathType.h>

#include "alignment.h"
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

// A launch's runs: how many, the rows and vectors of each, and the row length as a divisor.
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

// dx = scale * y * (dy - sum(dy * y)) over short rows that start mid-vector, whose y, dy and dx are contiguous from
// 16-byte boundaries, with no causal limit: a warp takes a run of `runs.rows` rows at a time, whole vectors, at most
// kWarp * ITERS.
template <typename scalar_t, int VEC, int ITERS>
__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocks<ITERS>)
    backward_flat(const BackwardParams p, const FlatRuns runs) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(std::is_same_v<acc_t, float>, "flat runs sum fp32 parts");
  __shared__ FlatRunSlots<kWarp * ITERS> warp_slots[kFlatWarps];
  const int cols = static_cast<int>(p.cols);
  const acc_t scale = static_cast<acc_t>(p.scale);
  for (int64_t visit = static_cast<int64_t>(blockIdx.x) * kFlatWarps + threadIdx.x / kWarp; visit < runs.count;
       visit += static_cast<int64_t>(gridDim.x) * kFlatWarps) {
    const int64_t first_row = visit * runs.rows;
    const scalar_t* const y = static_cast<const scalar_t*>(p.y) + first_row * cols;
    const scalar_t* const dy = static_cast<const scalar_t*>(p.dy) + first_row * cols;
    scalar_t* const dx = static_cast<scalar_t*>(p.dx) + first_row * cols;
    FlatRun<VEC, ITERS> run(warp_slots[threadIdx.x / kWarp], runs, cols);
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
        dx_values[v] = scale * y_values[i][v] * (dy_values[i][v] - (v < run.split[i] ? first[i] : second[i]));
      }
      if (run.stored(i)) store_vector<VEC, /*kEvictFirst=*/false>(dx, run.offset(i), dx_values);
    }
  }
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

// Launches `kernel(iters)` (a flat-run kernel of that many vectors a lane) over `runs`: kFlatIters where a run fits.
template <typename Kernel, typename Params>
void launch_runs(Kernel&& kernel, const Params& p, const FlatRuns& runs, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(runs.count, int64_t{kFlatWarps}), kMaxBlocks));
  if (runs.vectors <= kWarp * kFlatIters) {
    (kernel(std::integral_constant<int, kFlatIters>{}))<<<blocks, kFlatThreads, 0, stream>>>(p, runs);
  } else {
    (kernel(std::integral_constant<int, kFlatMaxIters>{}))<<<blocks, kFlatThreads, 0, stream>>>(p, runs);
  }
}

// Launches backward_flat where y's, dy's and dx's rows are contiguous from 16-byte boundaries and make flat runs,
// with no causal limit; false otherwise, and for fp64.
template <typename scalar_t, int VEC>
bool launch_backward_flat(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4 || VEC * sizeof(scalar_t) != 16) {
    return false;
  } else {
    const FlatRuns runs = flat_runs(p.rows, p.cols, VEC);
    if (runs.count == 0 || p.is_causal || !rows_contiguous(p.y, p.y_strides, p.shape, p.cols) ||
        !rows_contiguous(p.dy, p.dy_strides, p.shape, p.cols) ||
        !rows_contiguous(p.dx, contiguous_row_strides(p.shape, p.cols), p.shape, p.cols)) {
      return false;
    }
    launch_runs([&](auto iters) { return backward_flat<scalar_t, VEC, decltype(iters)::value>; }, p, runs, stream);
    return true;
  }
}

}  // namespace sms
