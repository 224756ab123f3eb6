// The forward's launches for scores of one dtype: the ladder by row length, the mask dispatch. Each dtype's are
// compiled in a file of their own (forward_<dtype>.cu), so that a build compiles them side by side.
#pragma once

#include <c10/cuda/CUDAException.h>

#include "../binding.h"
#include "alignment.h"
#include "forward.cuh"
#include "forward_launch.h"

namespace sms {
namespace {


// Causal rows of at least this many columns leave the register kernel even where they fit its registers: its block
// pays a whole row's chain of loads, reductions and stores however few keys the row sees, where the two-pass kernel
// reads and exponentiates a row's visible keys in a loop (benchmarks/NOTES.md, v10). fp32 rows from 8192 columns,
// where the two-pass kernel measured 1.16 of the floor against 1.44; 16-bit rows of 8192 columns measured slower in
// two passes (bf16 1.57 against 1.37), and rows of 4096 or fewer much slower in any dtype (v17). Such rows are
// narrowed first where they see at most half their keys; the others take forward_staged where it
// takes them, which draws its rows in order (v81) and measured faster than two passes: bf16 of 16,384 columns 1.126
// -> 1.107 of the floor, fp32 of 8192 1.109 -> 1.061 and of 16,384 1.084 -> 1.078 (v91); two passes where it does
// not (a mask row not in whole 16-byte words, a device other than sm_90).
template <typename scalar_t>
constexpr int64_t kCausalTwoPassColumns = sizeof(scalar_t) == 4 ? 8192 : 16384;

// Which long rows the cluster register kernel takes: those with an additive mask, whose slices hold twice the bytes
// of x alone. Without one, or with a bool mask, the two-pass kernel at three blocks a multiprocessor measured
// faster (benchmarks/NOTES.md, v11).
template <typename mask_t>
constexpr bool kClusterForwardsMask = mask_bytes_v<mask_t> >= 2;

// Rows that a block of at least this many threads shares reduce their max and sum at once (kOneReduction): with
// eight warps or more, a second round of barriers costs more than the exponential a thread that one round adds.
// At 128 threads (4096 bf16 columns) it measured no faster, at 512 (16384) 1.25 -> 1.17 of the floor; groups of
// lanes measured slower (benchmarks/NOTES.md, v13).
constexpr int kOneReductionThreads = 256;

// Causal rows of at least this many bytes take forward_staged however many blocks of forward_in_registers fit a
// multiprocessor: a causal row's block pays its chain of loads and reductions whatever its visible length, and its
// one or two bulk copies bring only the visible part. bf16 rows of 4096 columns (eight blocks) measured 1.308 ->
// 1.281 of the floor and of 8192 1.530 -> 1.454, where rows without a causal limit measured slower; causal rows of
// 1024 columns, in blocks of one or two warps, 1.138-1.236 -> 1.275-1.426 (benchmarks/NOTES.md, v22 and v23).
constexpr int64_t kStagedCausalRowBytes = 8192;

// Whether every row of the mask starts 16-byte aligned and spans whole 16-byte words, as bulk copies need.
template <typename mask_t>
bool mask_rows_in_words(const ForwardParams& p) {
  if constexpr (has_mask_v<mask_t>) {
    constexpr int kMaskVec = 16 / sizeof(mask_t);
    return p.cols % kMaskVec == 0 && rows_aligned(p.mask, p.mask_strides, p.shape, kMaskVec, sizeof(mask_t));
  } else {
    return true;
  }
}

// Launches forward_staged (launch_staged) for rows that whole blocks hold in registers (`plan`) where every mask row
// is whole 16-byte words from a 16-byte boundary; false otherwise. kShifted: rows that start mid-vector (`p` as
// launch_shifted makes it, with its tail copy of x), only without a mask.
template <typename scalar_t, typename mask_t, int VEC, int ITERS, bool kCausal, bool kOneReduction,
          bool kShifted = false>
bool launch_forward_staged(const ForwardParams& p, const RowPlan& plan, cudaStream_t stream) {
  if constexpr (VEC * sizeof(scalar_t) != 16 || ITERS < kTargetIters || (kShifted && has_mask_v<mask_t>)) {
    return false;
  } else {
    if (plan.width != plan.threads || !mask_rows_in_words<mask_t>(p)) return false;
    const bool long_causal = kCausal && p.cols * static_cast<int64_t>(sizeof(scalar_t)) >= kStagedCausalRowBytes;
    const int64_t staged_cols = columns_spanned<kShifted>(p.cols, VEC);
    return launch_staged(forward_staged<scalar_t, mask_t, VEC, ITERS, kCausal, kOneReduction, kShifted>,
                         forward_in_registers<scalar_t, mask_t, VEC, ITERS, kCausal, kOneReduction, kShifted>, p,
                         plan.threads,
                         kStagedRows * stage_bytes_for(staged_cols, sizeof(scalar_t), mask_bytes_v<mask_t>), stream,
                         long_causal ? std::numeric_limits<int>::max() : kStagedMaxBlocks);
  }
}

// The most blocks forward_staged_in_cluster splits a row over. With an additive mask, as many as a cluster holds:
// over 16 blocks of 256 threads, bf16 rows of 262,144 columns measured 1.26-1.28 -> 1.18-1.22 of the floor and fp32
// of 131,072 1.08-1.31 -> 1.04-1.23, against the cluster register kernel. Without one, or with a bool mask, eight:
// those rows measured 1.10-1.27 -> 1.16-1.34 over 16 blocks rather than 8 of 512 threads (benchmarks/NOTES.md, v27).
template <typename mask_t>
constexpr int kMostStagedBlocks = kClusterForwardsMask<mask_t> ? kMaxClusterBlocks : 8;

// Where two stages of a slice would take more blocks a row than this, forward_staged_in_cluster takes one stage over
// this many instead: a GPC holds whole clusters, and clusters of 16 at one block a multiprocessor leave about 15% of
// an H200's multiprocessors idle (v20, v24). bf16 rows of 262,144 columns with a full bf16 mask or a bf16 bias
// measured 1.17-1.22 -> 1.06 of the floor (benchmarks/NOTES.md, v49).
constexpr int kOneStageBlocks = 8;

// Clusters of at most this many blocks draw their rows in order (forward_staged_in_cluster's kDrawn). bf16 rows of
// 65,536 columns without a mask, in clusters of two blocks, measured 1.105-1.123 -> 1.054-1.066 of the floor: clusters
// that take rows by stride drift apart and end apart. In larger clusters the first block tells every block each row,
// and that warp's bookkeeping holds up the others at each row's reduction: clusters of four with a bf16 bias 1.014 ->
// 1.112, of eight at 262,144 columns 1.18 -> 1.21 (benchmarks/NOTES.md, v83 and v84).
constexpr int kMostDrawnClusterBlocks = 2;

// The share of the vector slots of `blocks` forward_staged_in_cluster blocks (kWideClusterIters a thread) that a row
// of `vectors` fills.
inline double staged_cluster_busy_share(int64_t vectors, int blocks) {
  return static_cast<double>(vectors) / (static_cast<double>(blocks) *
                                         threads_holding(ceil_div(vectors, blocks), kWideClusterIters) *
                                         kWideClusterIters);
}

// How much more of its slots a block count must fill than the planned one's to be taken instead. Rows a few vectors
// past a multiple of a warp's slots leave most of a warp idle in every block: bf16 rows of 65,539 columns measured
// 1.36 -> 1.12 of the floor over 3 blocks rather than 4 (89% of the slots -> 97%), of 131,077 1.49 -> 1.25 over 5
// rather than 8 (89% -> 99%); over 7 rather than 8 or 4 (94% -> 100%), fp32 rows of 100,000 with key padding 1.23 ->
// 1.12, bf16 ones 1.36 -> 1.25, without a mask 1.14 -> 1.12 and 1.27 -> 1.23. Counts that fill as many slots measured
// within 2% of each other in some rows and up to 6% apart in others, so the plan stays there (an H100;
// benchmarks/NOTES.md, v148 and v149).
constexpr double kBusierShare = 0.05;

// Launches forward_staged_in_cluster for the rows that the cluster register kernels would take (`shape`), in half as
// many blocks where those would hold kTargetIters vectors a thread (at least two), or in twice as many, up to
// kMostStagedBlocks, until two stages of a slice fit a block's shared memory (one stage over kOneStageBlocks where
// two would take more), or in the count up to kOneStageBlocks that fills kBusierShare more of its slots; where every
// slice of a mask row is whole 16-byte words from a 16-byte boundary and the device holds such a cluster with its
// stages; false otherwise, and for fp64 (its kernel with an fp64 mask spilled 8 bytes at 128 registers). kShifted:
// rows that start mid-vector (`p` as launch_shifted makes it, with its tail copy of x), only without a mask.
template <typename scalar_t, typename mask_t, int VEC, bool kShifted = false>
bool launch_forward_staged_in_cluster(const ForwardParams& p, const ClusterShape& shape, cudaStream_t stream) {
  if constexpr (VEC * sizeof(scalar_t) != 16 || sizeof(scalar_t) > 4 || (kShifted && has_mask_v<mask_t>)) {
    return false;
  } else {
    if (shape.blocks_per_row == 0 || !mask_rows_in_words<mask_t>(p)) return false;
    const int64_t span = columns_spanned<kShifted>(p.cols, VEC);
    const auto shared_bytes = [&](int blocks, int stages) {
      return stages * stage_bytes_for(slice_columns(span, VEC, blocks), sizeof(scalar_t), mask_bytes_v<mask_t>);
    };
    int blocks_per_row = shape.wide ? shape.blocks_per_row : std::max(2, shape.blocks_per_row / 2);
    const int64_t most_shared_bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    while (blocks_per_row < kMostStagedBlocks<mask_t> &&
           shared_bytes(blocks_per_row, kStagedRows) > most_shared_bytes) {
      blocks_per_row *= 2;
    }
    const bool one_stage =
        blocks_per_row > kOneStageBlocks && shared_bytes(kOneStageBlocks, 1) <= most_shared_bytes;
    const auto slices_in_words = [&](int blocks) {
      return !has_mask_v<mask_t> || slice_columns(span, VEC, blocks) * mask_bytes_v<mask_t> % 16 == 0;
    };
    if (one_stage) {
      blocks_per_row = kOneStageBlocks;
    } else if (blocks_per_row <= kOneStageBlocks) {
      const int64_t vectors = ceil_div(span, int64_t{VEC});
      int busiest = blocks_per_row;
      for (int blocks = std::max(2, fewest_wide_blocks(vectors, forward_max_threads<scalar_t, VEC, kTargetIters>));
           blocks <= kOneStageBlocks; ++blocks) {
        if (shared_bytes(blocks, kStagedRows) <= most_shared_bytes && slices_in_words(blocks) &&
            staged_cluster_busy_share(vectors, blocks) > staged_cluster_busy_share(vectors, busiest)) {
          busiest = blocks;
        }
      }
      if (staged_cluster_busy_share(vectors, busiest) >=
          staged_cluster_busy_share(vectors, blocks_per_row) + kBusierShare) {
        blocks_per_row = busiest;
      }
    }
    if (!slices_in_words(blocks_per_row)) return false;
    const int threads = threads_holding(slice_columns(span, VEC, blocks_per_row) / VEC, kWideClusterIters);
    const auto launch = [&](auto kernel, const ForwardParams& params, int stages) {
      return launch_clusters(kernel, params, blocks_per_row, threads, stream, shared_bytes(blocks_per_row, stages));
    };
    // Only rows whose two stages may take more than kOneStageBlocks blocks take one stage.
    if constexpr (kMostStagedBlocks<mask_t> > kOneStageBlocks) {
      if (one_stage) return launch(forward_staged_in_cluster<scalar_t, mask_t, VEC, 1, false, kShifted>, p, 1);
    }
    if (blocks_per_row <= kMostDrawnClusterBlocks) {
      const at::Tensor next_row = zeroed_row_counter();
      ForwardParams drawn = p;
      drawn.next_row = reinterpret_cast<unsigned long long*>(next_row.data_ptr<int64_t>());
      return launch(forward_staged_in_cluster<scalar_t, mask_t, VEC, kStagedRows, true, kShifted>, drawn,
                    kStagedRows);
    }
    return launch(forward_staged_in_cluster<scalar_t, mask_t, VEC, kStagedRows, false, kShifted>, p, kStagedRows);
  }
}

// Launches forward_in_cluster (kShifted, kMask: as its own) on the rows `shape` splits (launch_in_cluster).
template <typename scalar_t, typename mask_t, int VEC, bool kShifted = false,
          MaskPlacement kMask = MaskPlacement::kAlike>
bool launch_forward_in_cluster(const ForwardParams& p, const ClusterShape& shape, cudaStream_t stream) {
  return launch_in_cluster(forward_in_cluster<scalar_t, mask_t, VEC, kTargetIters, kShifted, kMask>,
                           wide_cluster_kernel<scalar_t, mask_t, VEC, kShifted, kMask>(), p, shape,
                           columns_spanned<kShifted>(p.cols, VEC), VEC,
                           forward_max_threads<scalar_t, VEC, kTargetIters>, stream);
}

// Launches the rows that blocks, one warp or groups of lanes hold whole in registers (`plan`): by forward_staged
// where it takes them, by forward_in_registers otherwise where `unstaged_too`; returns whether it launched.
// kShifted: rows that start mid-vector (forward_in_registers'), which forward_staged takes only without a mask;
// kMask: as forward_in_registers'.
template <typename scalar_t, typename mask_t, int VEC, bool kShifted = false,
          MaskPlacement kMask = kShifted ? MaskPlacement::kApart : MaskPlacement::kAlike>
bool launch_in_registers(const ForwardParams& p, const RowPlan& plan, bool unstaged_too, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  // Past register_plan's rows of one warp (below), rows that take more than kTargetIters vectors a thread are those
  // too long for the most threads a block has at kTargetIters, so their blocks have more than half of that: never
  // fewer than kOneReductionThreads.
  static_assert(max_threads_for(kTargetIters * registers_for<acc_t>(VEC, 1)) / 2 >= kOneReductionThreads);
  if constexpr (VEC > 1) {
    if (one_warp_past_target(plan)) {
      if (!unstaged_too) return false;
      with_past_target_iters(plan.iters, [&](auto iters) {
        with_flag(p.is_causal, [&](auto causal) {
          forward_in_registers<scalar_t, mask_t, VEC, decltype(iters)::value, causal(), false, kShifted, kMask>
              <<<blocks_for(p.rows, plan), plan.threads, 0, stream>>>(p, plan.width);
        });
      });
      return true;
    }
  }
  return with_iters(plan.iters, [&](auto iters) {
    constexpr int kIters = decltype(iters)::value;
    return with_flag(p.is_causal, [&](auto causal) {
      const auto launch = [&](auto one_reduction) {
        if (launch_forward_staged<scalar_t, mask_t, VEC, kIters, causal(), one_reduction(), kShifted>(p, plan,
                                                                                                    stream)) {
          return true;
        }
        if (!unstaged_too) return false;
        forward_in_registers<scalar_t, mask_t, VEC, kIters, causal(), one_reduction(), kShifted, kMask>
            <<<blocks_for(p.rows, plan), plan.threads, 0, stream>>>(p, plan.width);
        return true;
      };
      // Only the kernels a row can reach are instantiated: below kTargetIters vectors a thread, rows are shared by
      // groups of lanes, which reduce twice (as fp64 scores always do); above it, by blocks that reduce once.
      if constexpr (!std::is_same_v<acc_t, float> || kIters < kTargetIters) {
        return launch(std::false_type{});
      } else if constexpr (kIters > kTargetIters) {
        return launch(std::true_type{});
      } else {
        return with_flag(plan.width >= kOneReductionThreads, launch);
      }
    });
  });
}

// Vectors a thread of the register kernels aim to hold in the forward: kTargetIters, and two in rows of at most
// kShortForwardVectors (groups of twice the lanes), measured faster. bf16 rows of 49 columns, which start mid-vector
// (7 vectors), over the floor: 2.98 -> 2.14 without a mask, causal 3.94 -> 2.67, a full mask 1.94 -> 1.50; rows of 64
// columns 0.91-1.03 of their time (a full mask and a bias gain, key padding loses 3%); rows of 13-16 vectors mixed,
// 0.87-1.12 (an H100; NOTES, v108).
constexpr int64_t kShortForwardVectors = 8;

inline int forward_target_iters(int64_t cols, int vec) {
  return ceil_div(cols, int64_t{vec}) <= kShortForwardVectors ? 2 : kTargetIters;
}

template <typename scalar_t, typename mask_t, int VEC>
void forward_ladder(const ForwardParams& p, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  // Causal rows of kHalfNarrowedFromColumns or more that see at most half their keys are narrowed to what they see
  // (narrowed_to_visible) before any other kernel is tried. Upper-left, half as many queries as keys, ours over the
  // floor (benchmarks/NOTES.md, v94): bf16 of 2048 columns 1.25-1.41 -> 1.09-1.16, of 4096 1.21-1.25 -> 1.13-1.23, of
  // 8192 1.15-1.27 -> 1.08-1.14; fp32 of 2048 1.14-1.19 -> 1.05-1.06, of 4096 1.16-1.28 -> 1.07. Where rows would leave
  // the register kernels, forward_staged's blocks, sized for the whole row, took 1.15-1.30 of the floor at 16,384 bf16
  // and fp32 columns, two passes 1.07-1.14, narrowed 1.02-1.15 (v92).
  const auto launch_narrowed = [&](const ForwardParams& narrowed) {
    forward_ladder<scalar_t, mask_t, VEC>(narrowed, stream);
  };
  if (p.cols >= kHalfNarrowedFromColumns &&
      narrowed_to_visible(p, static_cast<scalar_t*>(p.y), kHalfNarrowedParts, stream, launch_narrowed)) {
    return;
  }
  const RowPlan plan = register_plan(p.cols, VEC, registers_for<acc_t>(VEC, 1), forward_target_iters(p.cols, VEC));
  const bool long_causal = p.is_causal && p.cols >= kCausalTwoPassColumns<scalar_t>;
  if (plan.in_registers && !long_causal) {
    launch_in_registers<scalar_t, mask_t, VEC>(p, plan, /*unstaged_too=*/true, stream);
    return;
  }
  if (plan.in_registers && launch_in_registers<scalar_t, mask_t, VEC>(p, plan, /*unstaged_too=*/false, stream)) return;
  const ClusterShape cluster = cluster_shape(p, VEC, forward_max_threads<scalar_t, VEC, kTargetIters>);
  if (launch_forward_staged_in_cluster<scalar_t, mask_t, VEC>(p, cluster, stream)) return;
  if constexpr (kClusterForwardsMask<mask_t>) {
    if (launch_forward_in_cluster<scalar_t, mask_t, VEC>(p, cluster, stream)) return;
  }
  with_flag(p.is_causal, [&](auto causal) {
    constexpr TwoPassShape kShape = kTwoPassShape<scalar_t, mask_t, causal()>;
    launch_two_pass(forward_two_pass<scalar_t, mask_t, VEC, kShape.min_blocks, kShape.unroll, kShape.fast_exp>, p,
                    VEC, stream);
  });
}

// Launches forward_in_registers on rows that start mid-vector, read from the vector boundary before each row's start,
// where y's rows start as far into theirs as x's (rows_shifted_alike) and whole rows fit a block's registers (causal
// rows short of kCausalTwoPassColumns), or forward_staged where it takes them (without a mask; bf16 causal rows of
// 9001 columns 1.24 -> 1.10 of the floor: v138); rows without a causal limit beyond them, and within a cluster's,
// forward_staged_in_cluster where it takes them (without a mask), forward_in_cluster otherwise;
// causal rows beyond them forward_two_pass (fp32 rows of 9001 columns, 1.26 -> 1.04 of the floor: v135); false
// otherwise. Read element by element (VEC 1), bf16 rows of 49, 197 and 1023 columns measured 2.0-6.6 times the
// floor, in vectors 1.0-4.0 (an H100; benchmarks/NOTES.md, v102). Not fp64.
template <typename scalar_t, typename mask_t, int VEC>
bool launch_shifted(const ForwardParams& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4) {
    return false;
  } else {
    constexpr int kBytes = sizeof(scalar_t);
    if (!rows_shifted_alike(p.x, p.x_strides, kBytes, p.y, contiguous_row_strides(p.shape, p.output_row_stride),
                            kBytes, p.shape, VEC)) {
      return false;
    }
    const RowPlan plan = shifted_plan(p.cols, VEC, registers_for<at::opmath_type<scalar_t>>(VEC, 1),
                                      forward_target_iters(shifted_span(p.cols, VEC), VEC));
    const bool long_causal = p.is_causal && (p.cols >= kCausalTwoPassColumns<scalar_t> || !plan.in_registers);
    const ClusterShape cluster =
        plan.in_registers || p.is_causal
            ? ClusterShape{0, 0, false}
            : split_over_cluster(shifted_span(p.cols, VEC), VEC, forward_max_threads<scalar_t, VEC, kTargetIters>);
    if (!plan.in_registers && !long_causal && cluster.blocks_per_row == 0) return false;
    ForwardParams shifted = p;
    const at::Tensor x_tail = copy_tail<scalar_t, VEC>(p.x, p.x_end, p.cols, shifted.x_tail, stream);
    const auto launch = [&](auto placement) {
      constexpr MaskPlacement kMask = decltype(placement)::value;
      if (long_causal) {
        // As forward_ladder's: forward_staged where it takes the rows (without a mask), two passes otherwise.
        if (plan.in_registers && launch_in_registers<scalar_t, mask_t, VEC, /*kShifted=*/true, kMask>(
                                     shifted, plan, /*unstaged_too=*/false, stream)) {
          return true;
        }
        constexpr TwoPassShape kShape = kTwoPassShape<scalar_t, mask_t, /*kCausal=*/true, /*kShifted=*/true>;
        launch_two_pass(forward_two_pass<scalar_t, mask_t, VEC, kShape.min_blocks, kShape.unroll, kShape.fast_exp,
                                         /*kShifted=*/true, kMask>,
                        shifted, VEC, stream);
        return true;
      }
      if (plan.in_registers) {
        return launch_in_registers<scalar_t, mask_t, VEC, /*kShifted=*/true, kMask>(shifted, plan,
                                                                                  /*unstaged_too=*/true, stream);
      }
      if (launch_forward_staged_in_cluster<scalar_t, mask_t, VEC, /*kShifted=*/true>(shifted, cluster, stream)) {
        return true;
      }
      // A floating mask joined from two vectors each (kApart), at kWideClusterIters, spilled 24-256 bytes (ptxas,
      // sm_90): such rows are left to the element-by-element ladder.
      if constexpr (kMask == MaskPlacement::kApart && has_mask_v<mask_t> && !std::is_same_v<mask_t, bool>) {
        return !cluster.wide && launch_clusters(forward_in_cluster<scalar_t, mask_t, VEC, kTargetIters, true, kMask>,
                                                shifted, cluster.blocks_per_row, cluster.threads, stream);
      } else {
        return launch_forward_in_cluster<scalar_t, mask_t, VEC, /*kShifted=*/true, kMask>(shifted, cluster, stream);
      }
    };
    if constexpr (has_mask_v<mask_t>) {
      // A mask whose rows start as far into their vectors as x's (a full mask, a bias where every batch starts a
      // whole number of vectors into x) is read one vector for each of x's, with no second to join; one whose rows
      // start as far in or half a vector further (a bias over 12 heads of 197 bf16 queries, whose every other batch
      // starts half a vector into x), as two half vectors, none of which passes the mask's end.
      const bool alike = rows_shifted_alike(p.x, p.x_strides, kBytes, p.mask, p.mask_strides, mask_bytes_v<mask_t>,
                                            p.shape, VEC);
      if constexpr (!std::is_same_v<mask_t, bool>) {
        if (!alike && mask_rows_in_half_vectors(p, kBytes, sizeof(mask_t), VEC)) {
          return launch(std::integral_constant<MaskPlacement, MaskPlacement::kHalfApart>{});
        }
      }
      const at::Tensor mask_tail = copy_tail<mask_t, VEC>(p.mask, p.mask_end, p.cols, shifted.mask_tail, stream);
      if (alike) return launch(std::integral_constant<MaskPlacement, MaskPlacement::kAlike>{});
      return launch(std::integral_constant<MaskPlacement, MaskPlacement::kApart>{});
    } else {
      return launch(std::integral_constant<MaskPlacement, MaskPlacement::kApart>{});
    }
  }
}

// The ladder of rows that are not all whole vectors from a vector boundary: causal rows of
// kUnalignedNarrowedFromColumns or more that see at most half their keys narrowed first, as forward_ladder's, then in
// vectors where launch_shifted takes them, element by element otherwise. Narrowed only in the element-by-element
// ladder, causal rows of 9001 columns that see up to 1024 keys took 1.5 times their floor in bf16 (in vectors, whole)
// and 3.4 in fp32; narrowed here, 1.19 and 1.08 (an H100; benchmarks/NOTES.md, v132-v135).
template <typename scalar_t, typename mask_t, int VEC>
void unaligned_ladder(const ForwardParams& p, cudaStream_t stream) {
  const auto launch_narrowed = [&](const ForwardParams& narrowed) {
    unaligned_ladder<scalar_t, mask_t, VEC>(narrowed, stream);
  };
  if (p.cols >= kUnalignedNarrowedFromColumns &&
      narrowed_to_visible(p, static_cast<scalar_t*>(p.y), kHalfNarrowedParts, stream, launch_narrowed)) {
    return;
  }
  if (!launch_shifted<scalar_t, mask_t, VEC>(p, stream)) forward_ladder<scalar_t, mask_t, 1>(p, stream);
}

}  // namespace

// Declared in forward_launch.h; instantiated once a dtype, in forward_<dtype>.cu.
template <typename scalar_t>
void launch_forward(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream) {
  dispatch_mask<scalar_t>(mask_kind, [&](auto mask_tag) {
    using mask_t = typename decltype(mask_tag)::type;
    // 16-byte vectors when every row of x, mask and y starts aligned, or y's as far into a vector as x's; element by
    // element otherwise.
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool aligned = p.cols % kVec == 0 &&
                         rows_aligned(p.x, p.x_strides, p.shape, kVec, sizeof(scalar_t)) &&
                         rows_aligned(p.y, contiguous_row_strides(p.shape, p.cols), p.shape, kVec, sizeof(scalar_t)) &&
                         (p.mask == nullptr ||
                          rows_aligned(p.mask, p.mask_strides, p.shape, kVec, mask_bytes_v<mask_t>));
    if (aligned) {
      forward_ladder<scalar_t, mask_t, kVec>(p, stream);
    } else {
      unaligned_ladder<scalar_t, mask_t, kVec>(p, stream);
    }
  });
}

}  // namespace sms
