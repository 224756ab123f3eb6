// The backward engine: dx = scale * y * (dy - sum(dy * y)) over each row, from the saved output y alone.
#pragma once

#include <ATen/OpMathType.h>

#include "../params.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"
#include "staged.cuh"

namespace sms {

// One row of y, dy and dx; y and dy are held as loaded (16-bit types stay packed, half the registers).
// kCausal: the row has a causal limit, past which nothing is read and dx is 0. Without one the per-vector checks
// are left out at compile time: they cost the 16-bit backward registers and 5-15% of its speed. Index: the type
// of a column, int where rows are short enough (the register kernels), as in ScoreLoader. kShifted: the row may start
// mid-vector, as ScoreLoader's, and dy's and dx's rows as far into theirs as y's (rows_shifted_alike).
template <typename scalar_t, int VEC, bool kCausal, typename Index = int64_t, bool kShifted = false>
struct GradientRow : RowStart<Index, kShifted> {
  using RowStart<Index, kShifted>::first;
  using acc_t = at::opmath_type<scalar_t>;
  // The two-pass kernel's rows, the ones indexed in 64 bits, whose second pass reads its slice from L2: their
  // loads are cached as each pass says (PassCaching, as ScoreLoader's), and their stores are streaming (store_bits).
  static constexpr bool kTwoPass = std::is_same_v<Index, int64_t>;
  struct Raw {
    Vector<scalar_t, VEC> y, dy;
  };

  const scalar_t* y;
  const scalar_t* dy;
  scalar_t* dx;
  Index end;  // one past the last column written: the row's end, or its slice's
  Index visible_end;
  acc_t scale;
  PassCaching caching;  // where kTwoPass

  // kEvenRows: as row_starts.
  template <bool kEvenRows = false>
  __device__ GradientRow(const BackwardParams& p, int64_t row, std::bool_constant<kEvenRows> = {})
      : end(static_cast<Index>(p.cols)),
        visible_end(static_cast<Index>(kCausal ? sms::visible_end(p, row) : p.cols)),
        scale(static_cast<acc_t>(p.scale)) {
    int64_t y_start, dy_start;
    row_starts<kEvenRows>(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
    y = static_cast<const scalar_t*>(p.y) + y_start;
    dy = static_cast<const scalar_t*>(p.dy) + dy_start;
    dx = static_cast<scalar_t*>(p.dx) + output_row_start<kCausal>(p, row);
    if constexpr (kShifted) {
      first = lead_of<VEC>(y);
      y = this->template read_from<VEC>(y - first, end, p.y_end, p.y_tail);
      dy = this->template read_from<VEC>(dy - first, end, p.dy_end, p.dy_tail);
      dx -= first;
      end += first;
      visible_end += first;
    }
    pin_addresses();
  }

  // A row whose y and dy lie at `y_row` and `dy_row` (in shared memory, where backward_staged brings them). Not
  // delegated to by the constructor above: with its addresses pinned before row_starts, backward_in_cluster's
  // 16-bit kernels spilled 12 bytes (ptxas, sm_90). y and dy are not pinned, as in ScoreLoader's.
  __device__ GradientRow(const BackwardParams& p, int64_t row, const scalar_t* y_row, const scalar_t* dy_row)
      : y(y_row),
        dy(dy_row),
        dx(static_cast<scalar_t*>(p.dx) + output_row_start<kCausal>(p, row)),
        end(static_cast<Index>(p.cols)),
        visible_end(static_cast<Index>(kCausal ? sms::visible_end(p, row) : p.cols)),
        scale(static_cast<acc_t>(p.scale)) {
    if constexpr (std::is_same_v<Index, int>) dx = row_address(dx);
  }

  // Takes the row from column `begin` on (a block's slice of the row), which becomes column 0. Where kShifted, begin
  // counts from the vector boundary before the row and is a whole number of vectors: a slice after the first starts
  // within the row.
  __device__ __forceinline__ void start_at(Index begin) {
    y += begin;
    dy += begin;
    dx += begin;
    pin_addresses();
    end -= begin;
    visible_end = visible_end > begin ? visible_end - begin : 0;
    if constexpr (kShifted) first = begin > 0 ? 0 : first;
  }

  // The row's addresses formed once (row_address) where columns are 32-bit.
  __device__ __forceinline__ void pin_addresses() {
    if constexpr (std::is_same_v<Index, int>) {
      y = row_address(y);
      dy = row_address(dy);
      dx = row_address(dx);
    }
  }

  // Takes only the columns before `slice_end` (a block's slice of the row). Where kShifted, slices are cut over the
  // most columns a row spans, and the last may pass the row's end.
  __device__ __forceinline__ void clip(Index slice_end) {
    end = kShifted && end < slice_end ? end : slice_end;
    visible_end = visible_end < slice_end ? visible_end : slice_end;
  }

  // Issues the loads of the vector at `col`, which must lie before visible_end.
  __device__ __forceinline__ void load(Index col, Raw& raw) const {
    if constexpr (kTwoPass) {
      raw.y = load_vector<VEC>(y, col, caching);
      raw.dy = load_vector<VEC>(dy, col, caching);
    } else {
      raw.y = load_vector<VEC>(y, col);
      raw.dy = load_vector<VEC>(dy, col);
    }
  }

  // How the loads are cached from here on, where kTwoPass.
  __device__ __forceinline__ void set_caching(const PassCaching& pass_caching) { caching = pass_caching; }

  // The vector at `col`, cached as `pass_caching` says (backward_reread, whose columns are 32-bit).
  __device__ __forceinline__ Raw read(Index col, const PassCaching& pass_caching) const {
    return {load_vector<VEC>(y, col, pass_caching), load_vector<VEC>(dy, col, pass_caching)};
  }

  // Keys past the visible ones are never read.
  __device__ __forceinline__ void fetch(Index col, Raw& raw) const {
    if (col < visible_end) load(col, raw);
  }

  // How many of the vector's elements at `col` are visible: VEC or more for all but the one the limit cuts.
  __device__ __forceinline__ Index visible_in(Index col) const { return visible_end - col; }

  __device__ __forceinline__ void gradient(const Raw& raw, acc_t row_dot, acc_t (&dx_values)[VEC]) const {
    acc_t y_values[VEC], dy_values[VEC];
    widen(raw.y, y_values);
    widen(raw.dy, dy_values);
#pragma unroll
    for (int v = 0; v < VEC; ++v) dx_values[v] = scale * y_values[v] * (dy_values[v] - row_dot);
  }

  // The sum of dy * y over the vector's first `count` elements (count >= VEC: all) but the `before` first.
  __device__ __forceinline__ acc_t products(const Raw& raw, Index count, Index before = 0) const {
    acc_t y_values[VEC], dy_values[VEC];
    widen(raw.y, y_values);
    widen(raw.dy, dy_values);
    acc_t sum = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if ((count >= VEC || v < count) && v >= before) sum += y_values[v] * dy_values[v];
    }
    return sum;
  }

  // dot() of a vector wholly before visible_end.
  __device__ __forceinline__ acc_t visible_dot(const Raw& raw) const { return products(raw, VEC); }

  __device__ __forceinline__ acc_t dot(Index col, const Raw& raw) const {
    const Index visible = visible_in(col);
    if (visible <= 0) return 0;
    if constexpr (kShifted) return products(raw, visible, first - col);
    return products(raw, kCausal ? visible : VEC);
  }

  // store_gradient() of a vector wholly before visible_end.
  __device__ __forceinline__ void store_visible_gradient(Index col, const Raw& raw, acc_t row_dot) const {
    acc_t dx_values[VEC];
    gradient(raw, row_dot, dx_values);
    store_vector<VEC, kTwoPass>(dx, col, dx_values);
  }

  // store_gradient(), dx being scale times the score gradient y * (dy - row_dot), which is added to `sums` too
  // (backward_with_bias_grad); hidden keys add 0.
  __device__ __forceinline__ void store_and_add_gradient(Index col, const Raw& raw, acc_t row_dot,
                                                         acc_t (&sums)[VEC]) const {
    if (col >= end) return;
    acc_t y_values[VEC], dy_values[VEC], dx_values[VEC];
    widen(raw.y, y_values);
    widen(raw.dy, dy_values);
    const Index visible = visible_in(col);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const acc_t score_grad = kCausal && v >= visible ? acc_t(0) : y_values[v] * (dy_values[v] - row_dot);
      sums[v] += score_grad;
      dx_values[v] = scale * score_grad;
    }
    store_vector<VEC, kTwoPass>(dx, col, dx_values);
  }

  // store_gradient(), the score gradients y * (dy - row_dot) going to `score_grads` (backward_with_bias_grad's rows
  // that start mid-vector, which add them to their sums in the row's own columns: add_in_row_columns); hidden keys,
  // and the columns past the row, give 0.
  __device__ __forceinline__ void store_gradient_of_scores(Index col, const Raw& raw, acc_t row_dot,
                                                           acc_t (&score_grads)[VEC]) const {
    acc_t y_values[VEC], dy_values[VEC], dx_values[VEC];
    widen(raw.y, y_values);
    widen(raw.dy, dy_values);
    const Index visible = visible_in(col);
    const Index within = end - col;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const bool seen = v < within && (!kCausal || v < visible);
      score_grads[v] = seen ? y_values[v] * (dy_values[v] - row_dot) : acc_t(0);
      dx_values[v] = scale * score_grads[v];
    }
    store_vector_within<VEC, kTwoPass>(dx, col, dx_values, first, end);
  }

  // Hidden keys get 0, whatever their (unread) y holds.
  __device__ __forceinline__ void store_gradient(Index col, const Raw& raw, acc_t row_dot) const {
    if (col >= end) return;
    acc_t dx_values[VEC];
    gradient(raw, row_dot, dx_values);
    const Index visible = visible_in(col);
    if (kCausal && visible < VEC) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        if (v >= visible) dx_values[v] = 0;
      }
    }
    if constexpr (kShifted) {
      store_vector_within<VEC, kTwoPass>(dx, col, dx_values, first, end);
    } else {
      store_vector<VEC, kTwoPass>(dx, col, dx_values);
    }
  }
};

template <typename scalar_t, int VEC, int ITERS>
constexpr int backward_max_threads = max_threads_for(ITERS * registers_for<scalar_t>(VEC, 2));

// 16-bit rows of up to four vectors a thread (blocks of up to 512 threads) held to 64 registers, as in the
// forward: two blocks a multiprocessor where the 71-78 registers they took left room for one. fp32 rows of 16-byte
// vectors likewise, up to kTargetIters a thread: the cluster kernel took 90 registers, one block of 512 threads a
// multiprocessor (benchmarks/NOTES.md, v27); element by element, at 16 vectors, fp32 spilled 4 bytes at 64.
template <typename scalar_t, int VEC, int ITERS>
constexpr bool kBackwardIn64Registers = (sizeof(scalar_t) == 2 && ITERS * VEC <= 32) ||
                                        (sizeof(scalar_t) == 4 && VEC == 4 && ITERS <= kTargetIters);

template <typename scalar_t, int VEC, int ITERS>
constexpr int backward_min_blocks =
    min_blocks_for(kBackwardIn64Registers<scalar_t, VEC, ITERS>, backward_max_threads<scalar_t, VEC, ITERS>);

// One row in registers: ITERS vectors of VEC elements of y and of dy a thread of `cover`; one reduction over the
// threads that share the row by `reduce(value, op, identity)`, one read of y and dy, then store(i, col, raw,
// row_dot) for each vector (by default, its dx).
template <int VEC, int ITERS, typename Row, typename Reduce, typename Store>
__device__ __forceinline__ void gradient_in_registers(const Row& g, const RowCover& cover, Reduce&& reduce,
                                                      Store&& store) {
  using acc_t = typename Row::acc_t;
  // Every vector loaded, clamped, as in the forward: left unset where a conditional load brought nothing, the
  // array cost registers (ptxas, sm_90: bf16 at four vectors a thread 84 against 64).
  typename Row::Raw raw[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) load_clamped<VEC>(g, cover.column(i, VEC), raw[i]);
  acc_t local_dot = 0;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) local_dot += g.dot(cover.column(i, VEC), raw[i]);
  const acc_t row_dot = reduce(local_dot, SumOp(), acc_t(0));
#pragma unroll
  for (int i = 0; i < ITERS; ++i) store(i, cover.column(i, VEC), raw[i], row_dot);
}

template <int VEC, int ITERS, typename Row, typename Reduce>
__device__ __forceinline__ void gradient_in_registers(const Row& g, const RowCover& cover, Reduce&& reduce) {
  gradient_in_registers<VEC, ITERS>(g, cover, reduce, [&](int, int col, const auto& raw, auto row_dot) {
    g.store_gradient(col, raw, row_dot);
  });
}

// Rows in registers: `width` threads per row (a group of lanes, or the whole block). kShifted: as GradientRow's.
template <typename scalar_t, int VEC, int ITERS, bool kCausal, bool kShifted = false>
__global__ void __launch_bounds__(backward_max_threads<scalar_t, VEC, ITERS>,
                                  backward_min_blocks<scalar_t, VEC, ITERS>)
    backward_in_registers(const BackwardParams p, const int width) {
  using Row = GradientRow<scalar_t, VEC, kCausal, int, kShifted>;
  using acc_t = typename Row::acc_t;
  __shared__ acc_t shared[kWarp];
  const RowCover cover(width);
  const auto reduce = [&](acc_t value, auto op, acc_t identity) {
    return row_reduce(value, op, identity, width, shared);
  };
  for (int64_t row = cover.first_row(); warp_has_row(row < p.rows); row += cover.row_step()) {
    const bool stored = row < p.rows;
    Row g(p, stored ? row : p.rows - 1);
    if (!stored) g.clip(0);
    gradient_in_registers<VEC, ITERS>(g, cover, reduce);
  }
}

// Adds to `sums` the score gradients of a row that starts `first` elements into its vector, held as loaded from the
// vector boundary before it (kShifted), in the row's own columns, where a row that starts on a boundary holds them:
// each vector's elements from `first` on, then the first `first` of the vector after it, which the next lane of the
// group holds (the group's first lane, as its next vector, for the last lane). Groups of up to a warp's lanes, all of
// which go round every row (warp_has_row).
template <int VEC, int ITERS, typename acc_t>
__device__ __forceinline__ void add_in_row_columns(const acc_t (&score_grads)[ITERS][VEC], int first,
                                                   const RowCover& cover, acc_t (&sums)[ITERS][VEC]) {
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    Vector<acc_t, VEC> here, after;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      // A group's first lane is read only by its last, which wants the vector after its own: its next one.
      const acc_t sent = cover.lane() != 0 ? score_grads[i][v] : i + 1 < ITERS ? score_grads[i + 1][v] : acc_t(0);
      after.element[v] = __shfl_sync(0xffffffffu, sent, cover.lane() + 1, cover.width());
      here.element[v] = score_grads[i][v];
    }
    const Vector<acc_t, VEC> in_row_columns = joined_at(here, after, first * static_cast<int>(sizeof(acc_t)));
#pragma unroll
    for (int v = 0; v < VEC; ++v) sums[i][v] += in_row_columns.element[v];
  }
}

// Registers a vector of backward_with_bias_grad's rows costs a thread: y and dy as backward_in_registers holds them,
// and the vector's sums in the compute type.
template <typename scalar_t, int VEC>
constexpr int bias_grad_registers_per_vector =
    registers_for<scalar_t>(VEC, 2) + registers_for<at::opmath_type<scalar_t>>(VEC, 1);

template <typename scalar_t, int VEC, int ITERS>
constexpr int bias_grad_max_threads = max_threads_for(ITERS * bias_grad_registers_per_vector<scalar_t, VEC>);

// Stores a thread's sums of backward_with_bias_grad, its ITERS vectors of `cover`, those before `cols`, to the
// bias-gradient row `bias_grad`, whose vectors are whole.
template <int VEC, int ITERS, typename acc_t>
__device__ __forceinline__ void store_sums(acc_t* bias_grad, const acc_t (&sums)[ITERS][VEC], const RowCover& cover,
                                           int cols) {
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    const int col = cover.column(i, VEC);
    if (col < cols) store_vector<VEC, false>(bias_grad, col, sums[i]);
  }
}

// The backward where the scores took a learnable bias (backward_with_bias_grad, BackwardParams), rows in registers:
// each group of `width` threads takes a group of sums, its part of one bias row's rows, a row after another as
// backward_in_registers takes them, adding each row's score gradient to its sums in registers as it stores dx; then
// stores the sums, once. y and dy are read once, dx and the sums written once, where autograd's composite formed the
// score gradients apart, in fp32, and summed them in a kernel of its own.
// kShifted: rows that may start mid-vector, as GradientRow's, in groups of lanes or a warp (add_in_row_columns),
// whose blocks are one warp (kShortRowThreads, shifted_plan).
template <typename scalar_t, int VEC, int ITERS, bool kCausal, bool kShifted = false>
__global__ void __launch_bounds__(kShifted ? kShortRowThreads : bias_grad_max_threads<scalar_t, VEC, ITERS>)
    backward_with_bias_grad(const BackwardParams p, const int width) {
  using Row = GradientRow<scalar_t, VEC, kCausal, int, kShifted>;
  using acc_t = typename Row::acc_t;
  __shared__ acc_t shared[kWarp];
  const RowCover cover(width);
  const auto reduce = [&](acc_t value, auto op, acc_t identity) {
    return row_reduce(value, op, identity, width, shared);
  };
  const int64_t repeats = p.bias_rows.quotient(p.rows);
  for (int64_t group = cover.first_row(); warp_has_row(group < p.bias_grad_rows); group += cover.row_step()) {
    // A group of lanes past the last group goes round with the others (warp_has_row) on the last group's rows, as
    // many, and stores nothing; as does every group past the rows of its bias row (the last part's).
    const bool stored = group < p.bias_grad_rows;
    int64_t bias_row;
    const int64_t first = p.bias_rows.quotient(stored ? group : p.bias_grad_rows - 1, bias_row) * p.rows_per_part;
    acc_t sums[ITERS][VEC] = {};
    for (int64_t repeat = first; repeat < first + p.rows_per_part; ++repeat) {
      Row g(p, (repeat < repeats ? repeat : repeats - 1) * p.bias_rows.value + bias_row);
      if (!stored || repeat >= repeats) g.clip(0);
      if constexpr (kShifted) {
        acc_t score_grads[ITERS][VEC];
        gradient_in_registers<VEC, ITERS>(g, cover, reduce, [&](int i, int col, const auto& raw, acc_t row_dot) {
          g.store_gradient_of_scores(col, raw, row_dot, score_grads[i]);
        });
        add_in_row_columns(score_grads, g.first, cover, sums);
      } else {
        gradient_in_registers<VEC, ITERS>(g, cover, reduce, [&](int i, int col, const auto& raw, acc_t row_dot) {
          g.store_and_add_gradient(col, raw, row_dot, sums[i]);
        });
      }
    }
    if (!stored) continue;
    acc_t* const bias_grad = static_cast<acc_t*>(p.bias_grad) + group * p.cols;
    if constexpr (kShifted) {
      // The bias's rows start mid-vector too: element by element, once a group.
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        const int col = cover.column(i, VEC);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          if (col + v < p.cols) bias_grad[col + v] = sums[i][v];
        }
      }
    } else {
      store_sums(bias_grad, sums, cover, static_cast<int>(p.cols));
    }
  }
}

// Threads a block of backward_reread has at most; at 32 registers, four such blocks fill a multiprocessor.
constexpr int kRereadThreads = 512;
// Rows of more than two vectors a thread of kRereadThreads: blocks of this many, two a multiprocessor.
constexpr int kRereadWideThreads = 1024;

// Rows without a causal limit, a block a row (the grid one block for each), read twice as torch.compile's looped
// reduction reads them: pass 1 sums dy * y a vector a thread at a time, keeping the lines in L1 (PassCaching);
// pass 2 reads y and dy again, from L1 where they are still there, and writes dx. A thread holds one vector at a
// time, where backward_in_registers holds its share of the row across the reduction. No row loop: the count of a
// loop over the shape's dims, kept across one, spilled 4 bytes at 32 registers (ptxas, sm_90).
// kEach (1 or 2): every thread takes exactly that many vectors of each row, and rows are evenly spaced (a one-dim
// shape, row_starts' kEvenRows), so that neither pass has a loop's bounds to test, as in torch.compile's kernel,
// which knows the row's length; 0: any row the launch gives it.
template <typename scalar_t, int VEC, int kEach, int kThreads = kRereadThreads>
__global__ void __launch_bounds__(kThreads, 2048 / kThreads) backward_reread(const BackwardParams p) {
  using Row = GradientRow<scalar_t, VEC, false, int>;
  using acc_t = typename Row::acc_t;
  __shared__ acc_t shared[kWarp];
  const int cols = static_cast<int>(p.cols);
  const int step = static_cast<int>(blockDim.x) * VEC;
  const int first = static_cast<int>(threadIdx.x) * VEC;
  const Row g(p, blockIdx.x, std::bool_constant<kEach != 0>{});
  const auto each_vector = [&](const auto& body) {
    if constexpr (kEach != 0) {
#pragma unroll
      for (int k = 0; k < kEach; ++k) body(first + k * step);
    } else {
#pragma unroll 1
      for (int col = first; col < cols; col += step) body(col);
    }
  };
  const PassCaching keep = PassCaching::of(L2Priority::kKeepInL2);
  const PassCaching leave = PassCaching::of(L2Priority::kLeaveL2);
  acc_t local_dot = 0;
  each_vector([&](int col) { local_dot += g.visible_dot(g.read(col, keep)); });
  const acc_t row_dot = row_reduce(local_dot, SumOp(), acc_t(0), static_cast<int>(blockDim.x), shared);
  each_vector([&](int col) { g.store_visible_gradient(col, g.read(col, leave), row_dot); });
}

// Rows that a block holds in registers, as backward_in_registers, brought into shared memory first as in
// forward_staged (each row's visible vectors of y and dy, in two bulk copies) but in one stage, into which the next
// row is sent for once the row is in registers, the rows drawn in order (for_each_drawn_row): two stages of y and dy
// left 16-bit rows of 16,384 columns one block a multiprocessor, where the register kernel fits two.
template <typename scalar_t, int VEC, int ITERS, bool kCausal>
__global__ void __launch_bounds__(backward_max_threads<scalar_t, VEC, ITERS>, backward_min_blocks<scalar_t, VEC, ITERS>)
    backward_staged(const BackwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Row = GradientRow<scalar_t, VEC, kCausal, int>;
  using acc_t = typename Row::acc_t;
  static_assert(VEC * sizeof(scalar_t) == 16, "bulk copies move whole 16-byte vectors");
  __shared__ acc_t shared[kWarp];
  const int64_t dy_offset = second_operand_offset(p.cols, sizeof(scalar_t));
  const auto locate = [&](int64_t row) {
    int64_t y_start, dy_start;
    row_starts(p.shape, row, p.y_strides, p.dy_strides, y_start, dy_start);
    const uint32_t bytes = copy_bytes(kCausal ? round_up(visible_end(p, row), VEC) : p.cols, sizeof(scalar_t));
    return StagedCopy{static_cast<const scalar_t*>(p.y) + y_start, static_cast<const scalar_t*>(p.dy) + dy_start,
                      bytes, bytes};
  };
  const RowCover cover(blockDim.x);
  const int64_t stage_bytes = stage_bytes_for(p.cols, sizeof(scalar_t), sizeof(scalar_t));
  for_each_drawn_row<1>(p.next_row, p.rows, stage_bytes, dy_offset, locate,
                        [&](int64_t row, unsigned char* stage, const auto& send_ahead) {
    const Row g(p, row, reinterpret_cast<const scalar_t*>(stage), reinterpret_cast<const scalar_t*>(stage + dy_offset));
    gradient_in_registers<VEC, ITERS>(g, cover, [&](acc_t value, auto op, acc_t identity) {
      const acc_t result = row_reduce(value, op, identity, blockDim.x, shared);
      send_ahead();
      return result;
    });
  });
#endif
}

// Rows too long for one block's registers but not for a cluster's (sm_90), without a causal limit, as in
// forward_in_cluster: one slice of a row for each block of a cluster, in registers, the slices' sums of dy * y
// added through distributed shared memory. A row is read once, where the two-pass kernel reads it twice.
// ITERS: as forward_in_cluster. kShifted: rows that start mid-vector, as GradientRow's, split over the most columns
// one spans from the vector boundary before it (shifted_span).
template <typename scalar_t, int VEC, int ITERS, bool kShifted = false>
__global__ void __launch_bounds__(backward_max_threads<scalar_t, VEC, kTargetIters>,
                                  ITERS == kTargetIters ? backward_min_blocks<scalar_t, VEC, kTargetIters> : 1)
    backward_in_cluster(const BackwardParams p, const int blocks_per_row) {
  using Row = GradientRow<scalar_t, VEC, false, int, kShifted>;
  const RowCover cover(blockDim.x);
  const int64_t span = columns_spanned<kShifted>(p.cols, VEC);
  for_each_cluster_visit<typename Row::acc_t, VEC>(span, p.rows, blocks_per_row,
                                                   [&](int64_t row, int begin, int width, const auto& reduce) {
    Row g(p, row);
    g.start_at(begin);
    g.clip(width);
    gradient_in_registers<VEC, ITERS>(g, cover, reduce);
  });
}

// backward_with_bias_grad's rows too long for one block's registers but not for a cluster's (sm_90), split as in
// backward_in_cluster, at kTargetIters vectors a thread: each cluster takes a group of sums, its part of one bias
// row's rows, a row after another, each block adding the score gradients of its slice to its sums in registers.
// Causal rows too: where the slices past a row's visible keys only store dx's zeros, these rows' alternative was
// ATen's, the score gradients formed apart in the compute type from converted copies of y and dy.
template <typename scalar_t, int VEC, bool kCausal>
__global__ void __launch_bounds__(bias_grad_max_threads<scalar_t, VEC, kTargetIters>)
    backward_with_bias_grad_in_cluster(const BackwardParams p, const int blocks_per_row) {
  using Row = GradientRow<scalar_t, VEC, kCausal, int>;
  using acc_t = typename Row::acc_t;
  const RowCover cover(blockDim.x);
  const int64_t repeats = p.bias_rows.quotient(p.rows);
  for_each_cluster_visit<acc_t, VEC>(p.cols, p.bias_grad_rows, blocks_per_row,
                                     [&](int64_t group, int begin, int width, const auto& reduce) {
    int64_t bias_row;
    const int64_t first = p.bias_rows.quotient(group, bias_row) * p.rows_per_part;
    const int64_t last = first + p.rows_per_part < repeats ? first + p.rows_per_part : repeats;
    acc_t sums[kTargetIters][VEC] = {};
    for (int64_t repeat = first; repeat < last; ++repeat) {
      Row g(p, repeat * p.bias_rows.value + bias_row);
      g.start_at(begin);
      g.clip(width);
      gradient_in_registers<VEC, kTargetIters>(g, cover, reduce, [&](int i, int col, const auto& raw, acc_t row_dot) {
        g.store_and_add_gradient(col, raw, row_dot, sums[i]);
      });
    }
    store_sums(static_cast<acc_t*>(p.bias_grad) + group * p.cols + begin, sums, cover, width);
  });
}

// Rows beyond one block's registers, in two passes over slices of the row as in forward_two_pass: pass 1 sums
// dy * y over the slice, the slices' sums are added through distributed shared memory, pass 2 reads both again
// (from L2) and writes dx; kUnroll vectors per thread in flight. One block a multiprocessor, as forward_two_pass.
// kShifted: as forward_two_pass's, a whole vector checked as any other where it may begin before the row.
template <typename scalar_t, int VEC, bool kCausal, bool kShifted = false>
__global__ void __launch_bounds__(kLongRowThreads, 1)
    backward_two_pass(const BackwardParams p, const int blocks_per_row) {
  using Row = GradientRow<scalar_t, VEC, kCausal, int64_t, kShifted>;
  using acc_t = typename Row::acc_t;
  __shared__ acc_t shared[kWarp];
  __shared__ ClusterExchange<acc_t, kMaxClusterBlocks> exchange;
  const RowSlice slice(columns_spanned<kShifted>(p.cols, VEC), VEC, blocks_per_row);
  if (blocks_per_row > 1) exchange.start();
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  const int64_t first = slice.begin + static_cast<int64_t>(threadIdx.x) * VEC;
  const PassCaching keep = PassCaching::of(L2Priority::kKeepInL2);
  const PassCaching leave = PassCaching::of(L2Priority::kLeaveL2);
  int round = 0;
  for (int64_t row = slice.first_row(); row < p.rows; row += slice.row_step()) {
    Row g(p, row);
    g.clip(slice.end);
    g.set_caching(keep);
    acc_t local_dot = 0;
    for_each_visible_vector<VEC, kUnroll>(g, first, step, [&](int64_t col, const auto& raw, auto whole) {
      if constexpr (decltype(whole)::value && !kShifted) {
        local_dot += g.visible_dot(raw);
      } else {
        local_dot += g.dot(col, raw);
      }
    });
    acc_t row_dot = row_reduce(local_dot, SumOp(), acc_t(0), blockDim.x, shared);
    if (blocks_per_row > 1) row_dot = exchange.reduce(row_dot, SumOp(), blocks_per_row, round++);
    g.set_caching(leave);
    const int64_t past = for_each_visible_vector<VEC, kUnroll>(g, first, step, [&](int64_t col, const auto& raw,
                                                                                  auto whole) {
      if constexpr (decltype(whole)::value && !kShifted) {
        g.store_visible_gradient(col, raw, row_dot);
      } else {
        g.store_gradient(col, raw, row_dot);
      }
    });
    store_filled<VEC, kShifted>(g.dx, past, g.end, step, scalar_t(0), g.first);
  }
  if (blocks_per_row > 1) exchange.finish();
}

}  // namespace sms
