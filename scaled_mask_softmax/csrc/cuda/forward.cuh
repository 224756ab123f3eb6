// The forward engine: y = softmax(scale * x + mask) over each row, scale, mask and causal limit applied as the
// row is loaded, accumulated in fp32 (fp64 for fp64).
#pragma once

#include <algorithm>

#include <ATen/NumericUtils.h>
#include <ATen/OpMathType.h>

#include "../params.h"
#include "launch.h"
#include "load_store.cuh"
#include "reduce.cuh"
#include "staged.cuh"

namespace sms {

constexpr float kLog2e = 1.4426950408889634f;

// 2^v by ex2.approx (2 ulp): the score precision is what limits fp32 accuracy, not this. The .ftz form flushes
// results below 2^-126 to 0 (terms that no sum holding the row's max, 1, can see) and saves __expf's three
// instructions a call that keep subnormal results.
__device__ __forceinline__ float exp2_approx(float v) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(v));
  return result;
}

__device__ __forceinline__ float log2_approx(float v) {
  float result;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(v));
  return result;
}

template <typename T>
__device__ __forceinline__ T exp_of(T v);
template <>
__device__ __forceinline__ float exp_of(float v) { return exp2_approx(v * kLog2e); }
template <>
__device__ __forceinline__ double exp_of(double v) { return exp(v); }

// exp(s - shift) for the scores s of one row.
template <typename acc_t>
struct SubtractedExp {
  acc_t shift;
  __device__ __forceinline__ acc_t operator()(acc_t s) const { return exp_of(s - shift); }
};

// The same in fp32 as 2^(s * log2(e) - shift * log2(e)): one fma before ex2 instead of a subtraction and a
// multiply. Rounding shift * log2(e) by some d scales every term of the row by 2^-d, which dividing by their sum
// cancels, so only terms normalised by their own sum may be formed this way; and only while 2^-d stays near 1:
// |shift| <= kLimit keeps |d| within 2^-8 (a row all masked with finfo.min shifts by -3.4e38, where d would
// be 2^102 if the product did not overflow).
struct FusedExp {
  static constexpr float kLimit = 65536.0f;
  float shift_log2;
  __device__ __forceinline__ explicit FusedExp(float shift) : shift_log2(shift * kLog2e) {}
  __device__ __forceinline__ float operator()(float s) const { return exp2_approx(fmaf(s, kLog2e, -shift_log2)); }
};

// Calls body(exp_shifted) with the fastest of the above that is exact enough for a row shifted by `shift`.
template <typename acc_t, typename Body>
__device__ __forceinline__ void with_row_exp(acc_t shift, Body&& body) {
  if constexpr (std::is_same_v<acc_t, float>) {
    if (fabsf(shift) <= FusedExp::kLimit) return body(FusedExp(shift));
  }
  body(SubtractedExp<acc_t>{shift});
}

// y = exp(s - shift) * inverse, the softmax of a row's score s; with_normalized_exp picks it or a faster form below.
template <typename acc_t>
struct NormalizedExp {
  acc_t shift;
  acc_t inverse;
  __device__ __forceinline__ acc_t operator()(acc_t s) const { return exp_of(s - shift) * inverse; }
};

// For 16-bit results: FusedExp's one fma before ex2, with the division folded into the shift as well,
// 2^(s * log2(e) - (shift * log2(e) + log2(sum))): two instructions an element fewer. Nothing cancels the rounding of
// that total: within kLimit it is at most 2^-14 in the exponent, 4e-5 of the result (fp16 rounds the result by
// 2^-11); only where the total stays within it is this taken.
struct FoldedExp {
  static constexpr float kLimit = 1024.0f;
  float total_log2;
  __device__ __forceinline__ float operator()(float s) const { return exp2_approx(fmaf(s, kLog2e, -total_log2)); }
};

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

// Calls body(normalized) with FoldedExp where kFast allows it and it is exact enough for a row of 16-bit results
// whose (max, sum) are `stats`, the sum formed with SubtractedExp; with NormalizedExp otherwise (a sum of 0, a row
// all masked, or NaN; a shift beyond FusedExp's limit). FoldedExp shifts by shift * log2(e) rounded, 2^-d times what
// SubtractedExp's terms were shifted by: the sum is re-expressed for that shift once a row (times 2^d), so that this
// rounding cancels as in FusedExp.
template <typename scalar_t, bool kFast, typename acc_t, typename Body>
__device__ __forceinline__ void with_normalized_exp(const SoftmaxStats<acc_t>& stats, Body&& body) {
  const acc_t shift = stats.max == -std::numeric_limits<acc_t>::infinity() ? acc_t(0) : stats.max;
  if constexpr (kFast && sizeof(scalar_t) == 2) {
    if (fabsf(shift) <= FusedExp::kLimit && stats.sum > 0.0f) {
      const float shift_log2 = shift * kLog2e;
      const float sum = stats.sum * exp2_approx(fmaf(shift, kLog2e, -shift_log2));
      const float total_log2 = shift_log2 + log2_approx(sum);
      if (fabsf(total_log2) <= FoldedExp::kLimit) return body(FoldedExp{total_log2});
    }
  }
  body(NormalizedExp<acc_t>{shift, stats.sum == acc_t(0) ? acc_t(0) : acc_t(1) / stats.sum});
}

struct MergeStats {
  template <typename acc_t>
  __device__ __forceinline__ SoftmaxStats<acc_t> operator()(const SoftmaxStats<acc_t>& a,
                                                            const SoftmaxStats<acc_t>& b) const {
    const acc_t max = fmax(a.max, b.max);
    return {max, a.sum_shifted_to(max) + b.sum_shifted_to(max)};
  }
};

// SoftmaxStats<float> as one 64-bit word, which one shuffle (or shared-memory slot) moves: max in the low half.
__device__ __forceinline__ uint64_t pack_stats(SoftmaxStats<float> stats) {
  return static_cast<uint64_t>(__float_as_uint(stats.sum)) << 32 | __float_as_uint(stats.max);
}

__device__ __forceinline__ SoftmaxStats<float> unpack_stats(uint64_t word) {
  return {__uint_as_float(static_cast<uint32_t>(word)), __uint_as_float(static_cast<uint32_t>(word >> 32))};
}

struct MergePackedStats {
  __device__ __forceinline__ uint64_t operator()(uint64_t a, uint64_t b) const {
    return pack_stats(MergeStats()(unpack_stats(a), unpack_stats(b)));
  }
};

// A row's (max, sum) from each thread's, in one reduction of the pairs packed in 64 bits; `reduce(value, op,
// identity)` reduces over the threads that share the row.
template <typename Reduce>
__device__ __forceinline__ SoftmaxStats<float> reduce_packed_stats(const SoftmaxStats<float>& local,
                                                                   Reduce&& reduce) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  return unpack_stats(reduce(pack_stats(local), MergePackedStats(), pack_stats({kMasked, 0.0f})));
}

// bf16 rows without a mask, four vectors a thread: the scores are formed from the row as loaded once for the max
// and again for the exponentials, instead of being held in fp32 across the max's reduction. That fits the kernel
// in 64 registers, which doubles the warps per multiprocessor (benchmarks/NOTES.md, v5: 1.32 -> 1.22 of the floor
// at 1024 columns, 2.04 -> 1.58 at 16384). fp16 rows and rows with a mask, which fit 64 registers without it,
// measured slower this way. Causal rows, which do not (68-70 registers, one block a multiprocessor fewer; v18),
// take it in both 16-bit types without a mask or with a bool one, whose bytes are held raw beside x's.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kCausal>
constexpr bool kReformsScores =
    VEC == 8 && ITERS == 4 &&
    (kCausal ? mask_bytes_v<mask_t> <= 1 : std::is_same_v<scalar_t, c10::BFloat16> && !has_mask_v<mask_t>);

template <typename scalar_t, int VEC, int ITERS>
constexpr int forward_max_threads = max_threads_for(ITERS * registers_for<at::opmath_type<scalar_t>>(VEC, 1));

// Kernels held to 64 registers a thread, as many blocks as that leaves room for: 16-bit rows of up to four vectors a
// thread (blocks of up to 512 threads, two of which then fit a multiprocessor where one did at 65-80 registers;
// benchmarks/NOTES.md, v9, v18) whose mask, if any, is 16-bit or bool; causal rows among them without a mask or with
// a bool one only because they reform their scores. float32 masks spill at 64.
template <typename scalar_t, typename mask_t, int VEC, int ITERS>
constexpr bool kIn64Registers =
    sizeof(scalar_t) == 2 && ITERS * VEC <= 32 && (!has_mask_v<mask_t> || sizeof(mask_t) <= 2);

// One row in registers: the threads of `cover` that share it (a group of lanes, or the whole block), ITERS vectors of
// VEC elements each; reductions over them by `reduce(value, op, identity)`, one read of x and mask, one write of y
// (columns before `store_end`).
// kReform: the scores are formed twice (kReformsScores). kSkipHidden: vectors wholly past the visible keys (a
// causal row's) take no exponentials; a branch per vector, which costs some kernels registers, so only causal rows
// take it. kOneReduction (fp32 scores): each thread exponentiates by its own max, and one reduction of the
// threads' (max, sum) pairs, packed in 64 bits, gives the row's, after which a thread rescales its terms by
// exp(own max - row max) / sum: one chain of shuffles and barriers a row instead of two (max, then sum), at one
// exponential more a thread and a few more in each step of the reduction. Otherwise the row's max is reduced
// first and the sum after.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kReform, bool kSkipHidden, bool kOneReduction,
          bool kConvertFirst = false, typename Loader, typename Reduce>
__device__ __forceinline__ void softmax_in_registers(const Loader& loader, const RowCover& cover, Reduce&& reduce,
                                                     scalar_t* y, int store_end, int tail_end = 0) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
  auto column = [&](int i) { return cover.column(i, VEC); };
  // Every vector loaded, clamped: left unset where a conditional load brought nothing, the array cost up to twice
  // the registers (ptxas, sm_90: bf16 with a bool mask at four vectors a thread 128 against 65); zeroed first, it
  // cost a merge of every 16-bit element.
  typename Loader::Raw raw[ITERS];
#pragma unroll
  for (int i = 0; i < ITERS; ++i) load_clamped<VEC>(loader, column(i), raw[i]);
  acc_t s[ITERS][VEC];
  acc_t local_max = kMasked;
#pragma unroll
  for (int i = 0; i < ITERS; ++i) {
    if (kSkipHidden && column(i) >= loader.visible_end) {
      // Wholly past the visible keys: masked without forming its scores.
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[i][v] = kMasked;
      continue;
    }
    if constexpr (kReform) {
      // The scores are formed again below: only their max is needed here.
      local_max = MaxOp()(local_max, loader.max_score(column(i), raw[i]));
    } else {
      loader.scores(column(i), raw[i], s[i]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) local_max = MaxOp()(local_max, s[i][v]);
    }
  }
  if constexpr (kReform) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) Loader::reform_after(raw[i]);
  }
  acc_t row_max = local_max;
  if constexpr (!kOneReduction) row_max = reduce(local_max, MaxOp(), kMasked);
  // A fully masked row (max -inf) shifts by 0, sums to 0 and is written as zeros.
  const acc_t shift = row_max == kMasked ? acc_t(0) : row_max;
  acc_t local_sum = 0;
  auto exponentiate = [&](const auto& exp_shifted) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      if (!kSkipHidden || column(i) < loader.visible_end) {
        if constexpr (kReform) loader.scores(column(i), raw[i], s[i]);
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
          s[i][v] = exp_shifted(s[i][v]);
          local_sum += s[i][v];
        }
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) s[i][v] = 0;
      }
    }
  };
  acc_t inverse;
  if constexpr (kOneReduction) {
    // Not FusedExp: its rounding of shift * log2(e) cancels only where every term of the row shares the shift.
    exponentiate(SubtractedExp<acc_t>{shift});
    const SoftmaxStats<float> row = reduce_packed_stats({local_max, local_sum}, reduce);
    // This thread's terms were shifted by its own max, at most the row's. A NaN sum still reaches every term.
    const float rescale = local_max == kMasked ? 0.0f : exp_of(local_max - row.max);
    inverse = row.sum == 0.0f ? 0.0f : rescale / row.sum;
  } else {
    with_row_exp(shift, exponentiate);
    const acc_t sum = reduce(local_sum, SumOp(), acc_t(0));
    inverse = sum == acc_t(0) ? acc_t(0) : acc_t(1) / sum;
  }
  if constexpr (kSkipHidden) {
    // A narrowed row (narrowed_to_visible zeroed its columns from store_end to tail_end before the launch) that came
    // out NaN: NaN there too, as all the rest of it.
    if (tail_end > store_end && at::_isnan(inverse)) {
      for (int col = store_end + cover.lane(); col < tail_end; col += cover.width()) {
        y[col] = std::numeric_limits<scalar_t>::quiet_NaN();
      }
    }
  }
  // Formed here once: seen through, the row's start was folded into each store's 64-bit address again (SASS, sm_90:
  // six instructions a vector where LEA and LEA.HI.X of the column do), as row_address says of the loads.
  // Only for 16-byte vectors, whose stores say they are global (store_bits); element-wise ones would turn generic.
  if constexpr (VEC * sizeof(scalar_t) == 16) y = row_address(y);
  if constexpr (kConvertFirst) {
    static_assert(!Loader::kShiftedRows, "rows that start mid-vector are stored a vector at a time");
    // Every vector converted, in registers of its own, before any is stored. Left to itself, the compiler converts
    // each vector at its store into the registers of the one before, and so waits for that store to read them
    // (SASS, sm_90; benchmarks/NOTES.md, v75 and v76).
    Vector<scalar_t, VEC> results[ITERS];
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[i][v] *= inverse;
      results[i] = converted<scalar_t>(s[i]);
      form_here(results[i]);
    }
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      if (column(i) < store_end) store_bits<VEC, /*kEvictFirst=*/false>(y, column(i), results[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int col = column(i);
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[i][v] *= inverse;
      // Not streamed (store_bits): stored plain, rows of 128-65,536 columns measured up to 2.2% faster (v57).
      if constexpr (Loader::kShiftedRows) {
        store_vector_within<VEC, /*kEvictFirst=*/false>(y, col, s[i], loader.first, store_end);
      } else if (col < store_end) {
        store_vector<VEC, /*kEvictFirst=*/false>(y, col, s[i]);
      }
    }
  }
}

// kMask: where the mask's rows lie against x's in rows that start mid-vector (forward_in_registers'); those joined
// (kApart) and held to 64 registers spilled 8-66 bytes (a 16-bit mask read element by element, v102), or 4-24 (a bool
// one, two vectors of it at a time, v104).
template <typename scalar_t, typename mask_t, int VEC, int ITERS, MaskPlacement kMask = MaskPlacement::kAlike>
constexpr int forward_min_blocks =
    min_blocks_for(kIn64Registers<scalar_t, mask_t, VEC, ITERS> &&
                       !(kMask == MaskPlacement::kApart && has_mask_v<mask_t>),
                   forward_max_threads<scalar_t, VEC, ITERS>);

// Rows in registers, each group of `width` threads reading its rows from global memory one after another; kCausal:
// the rows have a causal limit; kOneReduction (fp32 scores only): as softmax_in_registers; kShifted: rows may start
// mid-vector, as ScoreLoader's, and y's rows as far into theirs as x's (rows_shifted_alike); kMask: as
// ScoreLoader's.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kCausal, bool kOneReduction,
          bool kShifted = false, MaskPlacement kMask = kShifted ? MaskPlacement::kApart : MaskPlacement::kAlike>
__global__ void __launch_bounds__(forward_max_threads<scalar_t, VEC, ITERS>,
                                  forward_min_blocks<scalar_t, mask_t, VEC, ITERS, kMask>)
    forward_in_registers(const ForwardParams p, const int width) {
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(!kOneReduction || std::is_same_v<acc_t, float>, "one reduction packs fp32 max and sum");
  // Slots of 8 bytes: an fp64 value, or an fp32 max and sum packed.
  __shared__ uint64_t shared[kWarp];
  const RowCover cover(width);
  const auto reduce = [&](auto value, auto op, auto identity) {
    return row_reduce(value, op, identity, width, reinterpret_cast<decltype(value)*>(shared));
  };
  // Rows that reduce once are blocks' (launch_in_registers), never a group's: only the others go round warp by warp,
  // which cost the causal bf16 kernel with a bf16 mask that reduces once 16 bytes of spills (ptxas, sm_90).
  constexpr bool kGroups = !kOneReduction;
  for (int64_t visit = cover.first_row(); kGroups ? warp_has_row(visit < p.rows) : visit < p.rows;
       visit += cover.row_step()) {
    const bool stored = !kGroups || visit < p.rows;
    const int64_t row = p.order.row<kCausal>(stored ? visit : p.rows - 1);
    const ScoreLoader<scalar_t, mask_t, acc_t, VEC, int, kShifted, kMask> loader(p, row, kCausal);
    softmax_in_registers<scalar_t, mask_t, VEC, ITERS, kReformsScores<scalar_t, mask_t, VEC, ITERS, kCausal>, kCausal,
                         kOneReduction>(
        loader, cover, reduce, static_cast<scalar_t*>(p.y) + output_row_start<kCausal>(p, row) - loader.first,
        stored ? loader.first + static_cast<int>(p.cols) : 0,
        stored ? loader.first + static_cast<int>(p.output_row_stride) : 0);
  }
}

// The scores of a row that a staged kernel brought into `stage` (its mask from `mask_offset`), of which the columns
// before `visible` are visible. kShifted: the stage holds the row from the vector boundary before it, which starts
// `lead` elements further on.
template <typename scalar_t, typename mask_t, int VEC, bool kShifted = false>
__device__ __forceinline__ auto staged_scores(const ForwardParams& p, const unsigned char* stage, int64_t mask_offset,
                                              int visible, int lead = 0) {
  ScoreLoader<scalar_t, mask_t, at::opmath_type<scalar_t>, VEC, int, kShifted> loader(
      p, reinterpret_cast<const scalar_t*>(stage), reinterpret_cast<const mask_t*>(stage + mask_offset),
      lead + visible);
  if constexpr (kShifted) loader.first = lead;
  return loader;
}

// Where x's row `row` starts (its mask's row at `mask_start`), and how far into its vector (`lead`: 0 but where
// kShifted).
template <typename scalar_t, int VEC, bool kShifted>
__device__ __forceinline__ const scalar_t* x_row_start(const ForwardParams& p, int64_t row, int64_t& mask_start,
                                                       int& lead) {
  int64_t x_start;
  row_starts(p.shape, row, p.x_strides, p.mask_strides, x_start, mask_start);
  const scalar_t* x = static_cast<const scalar_t*>(p.x) + x_start;
  lead = kShifted ? lead_of<VEC>(x) : 0;
  return x;
}

// How far into its vector x's row `row` starts: 0 but where kShifted.
template <typename scalar_t, int VEC, bool kShifted>
__device__ __forceinline__ int x_row_lead(const ForwardParams& p, int64_t row) {
  if constexpr (kShifted) {
    int64_t mask_start;
    int lead;
    x_row_start<scalar_t, VEC, kShifted>(p, row, mask_start, lead);
    return lead;
  } else {
    return 0;
  }
}

// Rows that a block holds in registers, as forward_in_registers, but brought into shared memory first by the copy
// engine (each row's visible vectors of x and mask, 16 bytes each, in one or two bulk copies) a row ahead, in a
// persistent grid whose blocks draw their rows in order (for_each_drawn_row; p.next_row). A block's next row is then
// on its way while it works on this one, where the register kernel's block has nothing in flight between its last
// load of one row and its first of the next. Every mask row must start 16-byte aligned and span whole 16-byte words
// (launch_forward_staged). kShifted (no mask): rows that start mid-vector, y's as far into theirs as x's
// (rows_shifted_alike), each copied from the vector boundary before it over its vectors (from the tail copy where
// they would pass x's end, as ScoreLoader reads them), and held as forward_in_registers holds them.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kCausal, bool kOneReduction,
          bool kShifted = false>
__global__ void __launch_bounds__(forward_max_threads<scalar_t, VEC, ITERS>,
                                  forward_min_blocks<scalar_t, mask_t, VEC, ITERS>)
    forward_staged(const ForwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(VEC * sizeof(scalar_t) == 16, "bulk copies move whole 16-byte vectors");
  static_assert(!kShifted || !has_mask_v<mask_t>, "rows that start mid-vector are staged without a mask");
  constexpr int kMaskSize = mask_bytes_v<mask_t>;
  __shared__ uint64_t shared[kWarp];
  const int64_t staged_cols = columns_spanned<kShifted>(p.cols, VEC);
  const int64_t mask_offset = second_operand_offset(staged_cols, sizeof(scalar_t));
  const auto locate = [&](int64_t visit) {
    const int64_t row = p.order.row(visit);
    int64_t mask_start;
    int lead;
    const scalar_t* x = x_row_start<scalar_t, VEC, kShifted>(p, row, mask_start, lead);
    const int64_t visible = round_up(lead + visible_end(p, row), VEC);
    if constexpr (kShifted) x = vectors_from<VEC>(x - lead, int64_t{lead}, p.cols, p.x_end, p.x_tail);
    return StagedCopy{x, static_cast<const unsigned char*>(p.mask) + mask_start * kMaskSize,
                      copy_bytes(visible, sizeof(scalar_t)), copy_bytes(visible, kMaskSize)};
  };
  const RowCover cover(blockDim.x);
  const int64_t stage_bytes = stage_bytes_for(staged_cols, sizeof(scalar_t), kMaskSize);
  for_each_drawn_row<kStagedRows>(p.next_row, p.rows, stage_bytes, mask_offset, locate,
                                  [&](int64_t visit, unsigned char* stage, const auto& send_ahead) {
    // The row is in registers once the block's first reduction is through its barrier: the stage takes the row
    // after next then, not after this row's stores (16-bit rows of 16,384 columns 0.4-0.8% faster, causal ones of
    // 8192 2%; forward_staged_in_cluster, which leaves it to the loop, lost 1-6% so: benchmarks/NOTES.md, v29).
    const auto reduce = [&](auto value, auto op, auto identity) {
      const auto result = row_reduce(value, op, identity, blockDim.x, reinterpret_cast<decltype(value)*>(shared));
      send_ahead();
      return result;
    };
    const int64_t row = p.order.row(visit);
    const int lead = x_row_lead<scalar_t, VEC, kShifted>(p, row);
    const int visible = static_cast<int>(visible_end(p, row));
    const auto loader = staged_scores<scalar_t, mask_t, VEC, kShifted>(p, stage, mask_offset, visible, lead);
    softmax_in_registers<scalar_t, mask_t, VEC, ITERS, kReformsScores<scalar_t, mask_t, VEC, ITERS, kCausal>, kCausal,
                         kOneReduction>(loader, cover, reduce,
                                        static_cast<scalar_t*>(p.y) + output_row_start<kCausal>(p, row) - lead,
                                        lead + static_cast<int>(p.cols), lead + static_cast<int>(p.output_row_stride));
  });
#endif
}

// Rows too long for one block's registers but not for a cluster's (sm_90), without a causal limit: a row is split
// into one slice for each of the `blocks_per_row` blocks of a cluster, each holding its slice in registers at ITERS
// vectors a thread as forward_in_registers does a whole row, the slices' max and sum combined through distributed
// shared memory (for fp32 scores in one exchange, packed). A row is read once, where the two-pass kernels read it
// twice. kShifted, kMask: as forward_in_registers'; such rows are split over the most columns one spans from the
// vector boundary before it (shifted_span).
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kShifted, MaskPlacement kMask>
__device__ __forceinline__ void softmax_over_cluster(const ForwardParams& p, int blocks_per_row) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool kOneReduction = std::is_same_v<acc_t, float>;
  const RowCover cover(blockDim.x);
  const int64_t span = columns_spanned<kShifted>(p.cols, VEC);
  for_each_cluster_visit<std::conditional_t<kOneReduction, uint64_t, acc_t>, VEC>(
      span, p.rows, blocks_per_row, [&](int64_t visit, int begin, int width, const auto& reduce) {
    const int64_t row = p.order.row(visit);
    ScoreLoader<scalar_t, mask_t, acc_t, VEC, int, kShifted, kMask> loader(p, row, /*causal=*/false);
    // y's row from the vector boundary before it, as x's (rows_shifted_alike); the last slice may pass its end.
    const int first = loader.first;
    const int store_end = kShifted && first + static_cast<int>(p.cols) - begin < width
                              ? first + static_cast<int>(p.cols) - begin
                              : width;
    loader.start_at(begin);
    loader.clip(width);
    softmax_in_registers<scalar_t, mask_t, VEC, ITERS, kReformsScores<scalar_t, mask_t, VEC, ITERS, false>, false,
                         kOneReduction>(
        loader, cover, reduce, static_cast<scalar_t*>(p.y) + row * p.cols - first + begin, store_end);
  });
}

// softmax_over_cluster at kTargetIters vectors a thread, or at kWideClusterIters in one block a multiprocessor.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kShifted = false,
          MaskPlacement kMask = kShifted ? MaskPlacement::kApart : MaskPlacement::kAlike>
__global__ void __launch_bounds__(forward_max_threads<scalar_t, VEC, kTargetIters>,
                                  ITERS == kTargetIters ? forward_min_blocks<scalar_t, mask_t, VEC, kTargetIters, kMask>
                                                        : 1)
    forward_in_cluster(const ForwardParams p, const int blocks_per_row) {
  softmax_over_cluster<scalar_t, mask_t, VEC, ITERS, kShifted, kMask>(p, blocks_per_row);
}

// Warps that forward_in_cluster_wide's threads fit a multiprocessor's registers: 20 (96 registers a thread; five to
// each quarter of the multiprocessor, whose registers are four banks of 16,384), where the 114-128 that
// forward_in_cluster's 16-bit threads at kWideClusterIters take fit 16 (v151: at 112, still 16). bf16 rows of
// 131,077-200,003 columns with a mask ran 5-19% faster so (benchmarks/NOTES.md, v157; key padding the most).
constexpr int kWideClusterWarps = 20;

// softmax_over_cluster at kWideClusterIters vectors a thread, held to kWideClusterWarps a multiprocessor (bounded by
// one block of them, so that blocks of up to forward_max_threads at kTargetIters still launch).
template <typename scalar_t, typename mask_t, int VEC, bool kShifted, MaskPlacement kMask>
__global__ void __launch_bounds__(kWideClusterWarps * kWarp, 1)
    forward_in_cluster_wide(const ForwardParams p, const int blocks_per_row) {
  softmax_over_cluster<scalar_t, mask_t, VEC, kWideClusterIters, kShifted, kMask>(p, blocks_per_row);
}

// The kernel of rows at kWideClusterIters: forward_in_cluster_wide for 16-bit rows with a bool mask whose rows start
// as x's and bf16 rows with a bf16 mask, which fit its registers with nothing spilled; forward_in_cluster for the
// rest (ptxas, sm_90, at 96 registers: 16-bit rows without a mask, with an fp32 one or with a bool one joined from
// two vectors spilled 52-164 bytes, fp16 rows with an fp16 mask that start mid-vector 28; fp32 threads take 80-106
// under forward_in_cluster's bounds).
template <typename scalar_t, typename mask_t, int VEC, bool kShifted, MaskPlacement kMask>
constexpr auto wide_cluster_kernel() {
  constexpr bool kBoolAlike = std::is_same_v<mask_t, bool> && kMask != MaskPlacement::kApart;
  constexpr bool kBFloat16Pair = std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<mask_t, scalar_t>;
  if constexpr (sizeof(scalar_t) == 2 && (kBoolAlike || kBFloat16Pair)) {
    return forward_in_cluster_wide<scalar_t, mask_t, VEC, kShifted, kMask>;
  } else {
    return forward_in_cluster<scalar_t, mask_t, VEC, kWideClusterIters, kShifted, kMask>;
  }
}

// Rows split over the blocks of a cluster in registers, as forward_in_cluster at kWideClusterIters vectors a thread,
// each block's slice of x and mask brought into shared memory first, a row ahead, as in forward_staged: a block's
// next slice is then on its way while the cluster exchanges this row's max and sum, where forward_in_cluster's
// blocks have nothing in flight. At kTargetIters, held to 64 registers for two blocks a multiprocessor, the loop's
// state spilled 8-36 bytes (ptxas, sm_90, 16-bit rows with a mask). A persistent grid of clusters. Every slice of a
// mask row must start 16-byte aligned and span whole 16-byte words (launch_forward_staged_in_cluster).
// kStages: 2, or 1 where two stages would need clusters of 16; the one stage then takes the next row as soon as the
// slice is in registers (after the block's reduction), as forward_staged's stages do. kDrawn: the clusters draw their
// rows in order (for_each_cluster_drawn_row; p.next_row) rather than by stride. kShifted (no mask): rows that start
// mid-vector, y's as far into theirs as x's (rows_shifted_alike), split over the columns they span from the vector
// boundary before each (shifted_span), as forward_in_cluster's; a block copies its slice's vectors of the row from
// there (from the tail copy where they would pass x's end), none past the row's last.
template <typename scalar_t, typename mask_t, int VEC, int kStages, bool kDrawn, bool kShifted = false>
__global__ void __launch_bounds__(forward_max_threads<scalar_t, VEC, kTargetIters>, 1)
    forward_staged_in_cluster(const ForwardParams p, const int blocks_per_row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(!kShifted || !has_mask_v<mask_t>, "rows that start mid-vector are staged without a mask");
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool kOneReduction = std::is_same_v<acc_t, float>;
  using Value = std::conditional_t<kOneReduction, uint64_t, acc_t>;
  constexpr int kMaskSize = mask_bytes_v<mask_t>;
  __shared__ Value shared[kWarp];
  __shared__ ClusterExchange<Value, kMaxClusterBlocks> exchange;
  const int64_t span = columns_spanned<kShifted>(p.cols, VEC);
  const RowSlice slice(span, VEC, blocks_per_row);
  const int begin = static_cast<int>(slice.begin);
  const int width = static_cast<int>(slice.end - slice.begin);
  // Every block's stages are laid out for the widest slice.
  const int64_t widest = slice_columns(span, VEC, blocks_per_row);
  const int64_t mask_offset = second_operand_offset(widest, sizeof(scalar_t));
  const auto locate = [&](int64_t visit) {
    int64_t mask_start;
    int lead;
    const scalar_t* x = x_row_start<scalar_t, VEC, kShifted>(p, p.order.row(visit), mask_start, lead);
    int64_t copied = width;
    if constexpr (kShifted) {
      x = vectors_from<VEC>(x - lead, int64_t{lead}, p.cols, p.x_end, p.x_tail);
      copied = std::clamp<int64_t>(round_up(lead + p.cols, VEC) - begin, 0, widest);
    }
    return StagedCopy{x + begin, static_cast<const unsigned char*>(p.mask) + (mask_start + begin) * kMaskSize,
                      copy_bytes(copied, sizeof(scalar_t)), copy_bytes(width, kMaskSize)};
  };
  const RowCover cover(blockDim.x);
  int round = 0;
  exchange.start();
  const int64_t stage_bytes = stage_bytes_for(widest, sizeof(scalar_t), kMaskSize);
  const auto work_on_row = [&](int64_t visit, unsigned char* stage, const auto& send_ahead) {
    const auto reduce = [&](Value value, auto op, Value identity) {
      const Value block = row_reduce(value, op, identity, blockDim.x, shared);
      if constexpr (kStages == 1) send_ahead();
      return exchange.reduce(block, op, blocks_per_row, round++);
    };
    const int64_t row = p.order.row(visit);
    const int lead = x_row_lead<scalar_t, VEC, kShifted>(p, row);
    // The slice's keys before the row's visible end, counted from the slice's start (as is the row's first element,
    // `first`): all of them in a slice the row neither starts nor ends in (these rows have no causal limit). Given as
    // `width` there, a constant of the loop, it took up to 28 registers more (ptxas, sm_90).
    const int visible = static_cast<int>(std::clamp<int64_t>(lead + visible_end(p, row) - begin, 0, width));
    const int first = begin == 0 ? lead : 0;
    const auto loader = staged_scores<scalar_t, mask_t, VEC, kShifted>(p, stage, mask_offset, visible - first, first);
    // Results converted before they are stored only in clusters of more than two blocks (bf16 rows of 131,072
    // columns and more; of 65,536 with an additive mask): rows of 262,144 bf16 columns measured 3-4% faster so, but
    // those of 65,536 in clusters of two (drawn) 1.5-2.6% slower (benchmarks/NOTES.md, v76, v89). Rows that start
    // mid-vector are stored a vector at a time.
    softmax_in_registers<scalar_t, mask_t, VEC, kWideClusterIters, false, false, kOneReduction, !kDrawn && !kShifted>(
        loader, cover, reduce, static_cast<scalar_t*>(p.y) + row * p.cols - lead + begin, kShifted ? visible : width);
  };
  if constexpr (kDrawn) {
    for_each_cluster_drawn_row<kStages>(p.next_row, p.rows, blocks_per_row, stage_bytes, mask_offset, locate,
                                        work_on_row);
  } else {
    for_each_staged_row<kStages>(slice.first_row(), slice.row_step(), p.rows, stage_bytes, mask_offset, locate,
                                 work_on_row);
  }
  exchange.finish();
#endif
}

// The row's max and sum from each thread's of a block: for fp32, one reduction of the pairs packed in 64 bits;
// for fp64, the max and then the sums shifted to it. `shared`: the block's 8-byte slots.
template <typename acc_t>
__device__ __forceinline__ SoftmaxStats<acc_t> block_stats(const SoftmaxStats<acc_t>& local, uint64_t* shared) {
  if constexpr (std::is_same_v<acc_t, float>) {
    return reduce_packed_stats(local, [&](uint64_t value, auto op, uint64_t identity) {
      return row_reduce(value, op, identity, blockDim.x, shared);
    });
  } else {
    constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
    acc_t* slots = reinterpret_cast<acc_t*>(shared);
    const acc_t max = row_reduce(local.max, MaxOp(), kMasked, blockDim.x, slots);
    return {max, row_reduce(local.sum_shifted_to(max), SumOp(), acc_t(0), blockDim.x, slots)};
  }
}

// How the two-pass forward runs: the blocks a multiprocessor holds (__launch_bounds__'s minimum), the vectors a
// thread loads before using any, and whether pass 2 takes with_normalized_exp's fast form and stores its whole
// vectors unchecked.
struct TwoPassShape {
  int min_blocks;
  int unroll;
  bool fast_exp;
};

// Where the slices in flight are those of x alone (no mask, or a bool mask, usually one row that every row shares):
// three blocks, more warps to issue from than one (benchmarks/NOTES.md, v11); five blocks of two vectors a thread
// (48 registers) measured slower on these rows (v17). Causal rows, a lone block a row, which read on average half a
// row each and pay a row's chain of reductions: 16-bit ones at five blocks of two vectors with pass 2's fast form
// (which spilled at four blocks of four vectors); fp32 ones at four blocks, where five measured slower (v13, v17).
// (Rows that see at most half their keys never come here: narrowed_to_visible.) Otherwise one block, which
// ptxas meets with about 96 registers and two blocks; with a 16-bit mask, which doubles what a slice holds, fewer
// slices at once leave pass 2 finding them in L2 (v10). fp32 results keep pass 2's plain form: with a bool mask at
// 262,144 columns the fused one measured 6% slower (v16). launch_two_pass sizes slices by kUnroll vectors a thread,
// which only rows without a causal limit are split into. Causal rows that start mid-vector (kShifted) with a bool mask
// at a block fewer: as many as the others, 16-bit ones spilled 12-80 bytes and fp32 ones 36-80 (ptxas, sm_90).
template <typename scalar_t, typename mask_t, bool kCausal, bool kShifted = false>
constexpr TwoPassShape kTwoPassShape =
    sizeof(scalar_t) > 4 || mask_bytes_v<mask_t> > 1 ? TwoPassShape{1, kUnroll, sizeof(scalar_t) == 2}
    : !kCausal                                      ? TwoPassShape{3, kUnroll, sizeof(scalar_t) == 2}
    : sizeof(scalar_t) == 2 ? TwoPassShape{kShifted && has_mask_v<mask_t> ? 4 : 5, 2, true}
                            : TwoPassShape{kShifted && has_mask_v<mask_t> ? 3 : 4, kUnroll, false};

// Rows beyond one block's registers, in two passes over slices of the row: one slice for each of the
// `blocks_per_row` blocks of a cluster (or the whole row for a lone block). Pass 1 keeps a running max and a sum
// of exponentials rescaled to it; the slices' figures are merged through distributed shared memory; pass 2 reads
// the slice again, from L2 while slices are small, and writes y. The rest as kTwoPassShape gives it (a struct as a
// template argument is beyond the host stubs nvcc writes): kUnrollVectors vectors per thread are loaded before any
// is used, to keep enough bytes in flight. kShifted, kMask: as forward_in_registers'; such rows are sliced over the
// most columns one spans from the vector boundary before it (shifted_span).
template <typename scalar_t, typename mask_t, int VEC, int kMinBlocks, int kUnrollVectors, bool kFastExp,
          bool kShifted = false, MaskPlacement kMask = MaskPlacement::kAlike>
__global__ void __launch_bounds__(kLongRowThreads, kMinBlocks)
    forward_two_pass(const ForwardParams p, const int blocks_per_row) {
  using acc_t = at::opmath_type<scalar_t>;
  using Loader = ScoreLoader<scalar_t, mask_t, acc_t, VEC, int64_t, kShifted, kMask>;
  constexpr acc_t kMasked = -std::numeric_limits<acc_t>::infinity();
  __shared__ uint64_t shared[kWarp];
  __shared__ ClusterExchange<SoftmaxStats<acc_t>, kMaxClusterBlocks> exchange;
  const RowSlice slice(columns_spanned<kShifted>(p.cols, VEC), VEC, blocks_per_row);
  if (blocks_per_row > 1) exchange.start();
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  const int64_t first = slice.begin + static_cast<int64_t>(threadIdx.x) * VEC;
  const PassCaching keep = PassCaching::of(L2Priority::kKeepInL2, /*hint_l1=*/false);
  const PassCaching leave = PassCaching::of(L2Priority::kLeaveL2, /*hint_l1=*/false);
  int round = 0;
  for (int64_t visit = slice.first_row(); visit < p.rows; visit += slice.row_step()) {
    const int64_t row = p.order.row(visit);
    Loader loader(p, row, /*causal=*/true);
    loader.clip(slice.end);
    loader.set_caching(keep);
    acc_t local_max = kMasked;
    acc_t local_sum = 0;
    for_each_visible_vector<VEC, kUnrollVectors>(loader, first, step, [&](int64_t col, const auto& raw, auto whole) {
      acc_t s[VEC];
      loader.scores(col, raw, whole, s);
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
    });
    SoftmaxStats<acc_t> stats = block_stats(SoftmaxStats<acc_t>{local_max, local_sum}, shared);
    if (blocks_per_row > 1) stats = exchange.reduce(stats, MergeStats(), blocks_per_row, round++);
    // y's row from the vector boundary before it, as x's (rows_shifted_alike); the last slice may pass its end.
    scalar_t* y = static_cast<scalar_t*>(p.y) + row * p.output_row_stride - loader.first;
    const int64_t end = kShifted && loader.first + p.cols < slice.end ? loader.first + p.cols : slice.end;
    loader.set_caching(leave);
    with_normalized_exp<scalar_t, kFastExp>(stats, [&](const auto& normalized) {
      const int64_t past = for_each_visible_vector<VEC, kUnrollVectors>(loader, first, step, [&](int64_t col,
                                                                                         const auto& raw, auto whole) {
        acc_t s[VEC];
        loader.scores(col, raw, whole, s);
#pragma unroll
        for (int v = 0; v < VEC; ++v) s[v] = normalized(s[v]);
        // A whole vector lies before visible_end, which clip() put at or before the slice's end.
        if constexpr (kShifted) {
          store_vector_within<VEC>(y, col, s, loader.first, end);
        } else if ((kFastExp && decltype(whole)::value) || col < slice.end) {
          store_vector<VEC>(y, col, s);
        }
      });
      // Past the visible keys, zeros; NaN in a row that saw a NaN or +inf score (its sum NaN), as all the rest of it,
      // up to y's row length where the launch is narrowed (narrowed_to_visible: zeroed before it).
      const bool nan_row = at::_isnan(stats.sum);
      const scalar_t hidden = nan_row ? std::numeric_limits<scalar_t>::quiet_NaN() : scalar_t(0);
      store_filled<VEC, kShifted>(y, past, nan_row && p.is_causal ? loader.first + p.output_row_stride : end, step,
                                  hidden, loader.first);
    });
  }
  if (blocks_per_row > 1) exchange.finish();
}

}  // namespace sms
