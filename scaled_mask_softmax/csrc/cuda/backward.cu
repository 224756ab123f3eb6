// The backward pass on CUDA: tensors -> params, dtype dispatch, the ladder by row length.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <tuple>
#include <utility>

#include "../binding.h"
#include "alignment.h"
#include "backward.cuh"
#include "flat.cuh"

namespace sms {
namespace {

// Launches backward_staged (launch_staged) for causal rows that whole blocks hold in registers (`plan`); false
// otherwise. Causal bf16 rows of 16,384 columns measured 1.119 -> 1.107 of the floor, fp32 of 8192 1.208 -> 1.168;
// rows without a causal limit slower, bf16 of 16,384 columns 0.972 -> 1.026 (benchmarks/NOTES.md, v23).
template <typename scalar_t, int VEC, int ITERS, bool kCausal>
bool launch_backward_staged(const BackwardParams& p, const RowPlan& plan, cudaStream_t stream) {
  if constexpr (!kCausal || VEC * sizeof(scalar_t) != 16 || ITERS < kTargetIters) {
    return false;
  } else {
    return plan.width == plan.threads &&
           launch_staged(backward_staged<scalar_t, VEC, ITERS, kCausal>,
                         backward_in_registers<scalar_t, VEC, ITERS, kCausal>, p, plan.threads,
                         stage_bytes_for(p.cols, sizeof(scalar_t), sizeof(scalar_t)), stream);
  }
}

// Vectors a thread of the register kernels aims to hold in the backward. Without a causal limit two, in groups of
// twice the lanes or blocks of twice the threads: 1.0-1.5% faster than four at 128 columns, up to 0.6% at 512-4096,
// and one a thread slower (benchmarks/NOTES.md, v30). A causal row's block pays its reduction and its zeros whatever
// it sees, so more threads a row lose there (v15): causal rows keep kTargetIters.
constexpr int backward_target_iters(bool causal) { return causal ? kTargetIters : 2; }

// The register kernels' causal rows of at most kShortCausalVectors vectors take two a thread nonetheless, in groups
// of twice the lanes, measured faster. An H100 found it so up to 16 vectors (NOTES, v108), an H200 only up to 8: its
// bf16 causal rows over the floor, four a thread -> two, 49 columns (7 vectors, mid-vector) 3.07 -> 2.78, 64 columns
// 1.64 -> 1.48, but 97 columns 1.82 -> 2.08 and 128 columns 1.25 -> 1.35 (NOTES, v146). The learnable bias's
// backward keeps backward_target_iters(causal): not measured there.
constexpr int64_t kShortCausalVectors = 8;

inline int backward_target_iters(bool causal, int64_t cols, int vec) {
  return ceil_div(cols, int64_t{vec}) <= kShortCausalVectors ? 2 : backward_target_iters(causal);
}

// Rows without a causal limit of kRereadVectors.first to .second 16-byte vectors (up to two a thread) take
// backward_reread: measured 0.7-2.4% faster than the register kernels from 512 to 8192 16-bit columns and 512 to
// 4096 fp32 ones (benchmarks/NOTES.md, v34); in blocks of kRereadWideThreads beyond two vectors a thread of
// kRereadThreads, bf16 16,384 columns and fp32 8192 1.3-1.7% faster (v55.1). Rows of more than two vectors a
// thread, and of 128 columns, measured far slower (v33).
constexpr std::pair<int64_t, int64_t> kRereadVectors{64, 2 * kRereadWideThreads};

// Launches backward_reread for the rows it takes (kRereadVectors); false otherwise.
template <typename scalar_t, int VEC, bool kCausal>
bool launch_backward_reread(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (kCausal || VEC * sizeof(scalar_t) != 16 || sizeof(scalar_t) > 4) {
    return false;
  } else {
    const int64_t vectors = p.cols / VEC;
    if (vectors < kRereadVectors.first || vectors > kRereadVectors.second ||
        p.rows > std::numeric_limits<int>::max()) {
      return false;
    }
    const bool wide = vectors > 2 * kRereadThreads;
    const int threads =
        wide ? kRereadWideThreads : static_cast<int>(std::min<int64_t>(round_up(vectors, kWarp), kRereadThreads));
    // Rows evenly spaced in y and dy (one dim left by collapse_rows, as contiguous tensors leave it) find their
    // start in one multiply, so that a block's first loads go out sooner: bf16 4096 columns 1.2% faster (v55).
    // Where each thread then takes the same whole number of vectors (one or two), the passes have no loop bounds:
    // bf16 4096 columns 0.7-0.9% faster (v59).
    const int each = p.shape.dims == 1 && vectors % threads == 0 ? static_cast<int>(vectors / threads) : 0;
    const auto launch = [&](auto kernel) { kernel<<<static_cast<unsigned>(p.rows), threads, 0, stream>>>(p); };
    const auto launch_each = [&](auto each_constant) {
      constexpr int kEach = decltype(each_constant)::value;
      if (wide) {
        launch(backward_reread<scalar_t, VEC, kEach, kRereadWideThreads>);
      } else {
        launch(backward_reread<scalar_t, VEC, kEach>);
      }
    };
    switch (each) {
      case 1: launch_each(std::integral_constant<int, 1>{}); break;
      case 2: launch_each(std::integral_constant<int, 2>{}); break;
      default: launch_each(std::integral_constant<int, 0>{});
    }
    return true;
  }
}

// Causal rows of kHalfNarrowedFromColumns or more that see at most half their keys are narrowed to what they see
// (narrowed_to_visible) before any other kernel is tried, where the narrowed rows fit one block's registers.
// Upper-left, half as many queries as keys, ours over the floor (benchmarks/NOTES.md, v93, version 68 and v96): bf16
// rows of 2048-8192 columns 1.13-1.19 -> 1.04-1.06, of 16,384 1.10 -> 1.03; fp32 1.04-1.10 -> 1.02-1.04; 16-bit rows
// of 32,768 columns 1.20-1.23 -> 1.04-1.07. Narrowed rows that take two passes either way were mixed: fp32 rows of
// 32,768 columns 1.03-1.06 -> 1.04-1.09, 16-bit rows of 65,536 1.04-1.05 -> 1.12-1.14; fp32 rows of 65,536 gained
// (narrowed_at_half).
template <typename scalar_t, int VEC, bool kCausal>
bool narrowed_at_half_fits_registers(const BackwardParams& p) {
  return plan_block(narrowed_columns(p), VEC, registers_for<scalar_t>(VEC, 2), backward_target_iters(kCausal))
      .in_registers;
}

// fp32 causal rows of kFloatHalfNarrowedFromColumns or more that see at most half their keys are narrowed too,
// though the narrowed rows take two passes as the whole ones do: whole, the row kernel's stores of their zeros
// (half of dx) run at 3.7 TB/s, slower than a kernel that only writes them (benchmarks/NOTES.md, v99: 1.11-1.16 ->
// 1.01-1.09 of the floor). At 32,768 columns the rows taken alone run at 1.10 of their floor and the whole ones at
// 1.02 (narrowed 1-2% slower); 16-bit rows of 65,536 narrowed were 8-9% slower.
constexpr int64_t kFloatHalfNarrowedFromColumns = 65536;

template <typename scalar_t, int VEC, bool kCausal>
bool narrowed_at_half(const BackwardParams& p) {
  return p.cols >= kHalfNarrowedFromColumns &&
         (narrowed_at_half_fits_registers<scalar_t, VEC, kCausal>(p) ||
          (std::is_same_v<scalar_t, float> && p.cols >= kFloatHalfNarrowedFromColumns));
}

// Causal rows beyond one block's registers that see at most a quarter of their keys are narrowed to what they see:
// bf16 rows of 65,536 columns measured 1.15 -> 1.01 of the floor (version 63).
constexpr int kLongRowNarrowedParts = 4;

// Launches backward_in_registers on the rows of `plan` (register_plan's), or backward_staged where it takes them.
// kShifted: rows that start mid-vector, which backward_staged does not take.
template <typename scalar_t, int VEC, bool kCausal, bool kShifted = false>
void launch_backward_in_registers(const BackwardParams& p, const RowPlan& plan, cudaStream_t stream) {
  const auto launch = [&](auto iters) {
    backward_in_registers<scalar_t, VEC, decltype(iters)::value, kCausal, kShifted>
        <<<blocks_for(p.rows, plan), plan.threads, 0, stream>>>(p, plan.width);
  };
  if constexpr (VEC > 1) {
    if (one_warp_past_target(plan)) {
      with_past_target_iters(plan.iters, launch);
      return;
    }
  }
  with_iters(plan.iters, [&](auto iters) {
    if constexpr (!kShifted) {
      if (launch_backward_staged<scalar_t, VEC, decltype(iters)::value, kCausal>(p, plan, stream)) return;
    }
    launch(iters);
  });
}

// Launches backward_in_cluster (kShifted: as its own) on the rows `shape` splits (launch_in_cluster).
template <typename scalar_t, int VEC, bool kShifted = false>
bool launch_gradient_in_cluster(const BackwardParams& p, const ClusterShape& shape, cudaStream_t stream) {
  return launch_in_cluster(backward_in_cluster<scalar_t, VEC, kTargetIters, kShifted>,
                           backward_in_cluster<scalar_t, VEC, kWideClusterIters, kShifted>, p, shape,
                           columns_spanned<kShifted>(p.cols, VEC), VEC,
                           backward_max_threads<scalar_t, VEC, kTargetIters>, stream);
}

template <typename scalar_t, int VEC, bool kCausal>
void backward_ladder(const BackwardParams& p, cudaStream_t stream) {
  const auto launch_narrowed = [&](const BackwardParams& narrowed) {
    backward_ladder<scalar_t, VEC, kCausal>(narrowed, stream);
  };
  scalar_t* const dx = static_cast<scalar_t*>(p.dx);
  if (narrowed_at_half<scalar_t, VEC, kCausal>(p) &&
      narrowed_to_visible(p, dx, kHalfNarrowedParts, stream, launch_narrowed)) {
    return;
  }
  if (launch_backward_reread<scalar_t, VEC, kCausal>(p, stream)) return;
  const RowPlan plan =
      register_plan(p.cols, VEC, registers_for<scalar_t>(VEC, 2), backward_target_iters(kCausal, p.cols, VEC));
  if (!plan.in_registers) {
    if (narrowed_to_visible(p, dx, kLongRowNarrowedParts, stream, launch_narrowed)) {
      return;
    }
    const ClusterShape cluster = cluster_shape(p, VEC, backward_max_threads<scalar_t, VEC, kTargetIters>);
    if (!launch_gradient_in_cluster<scalar_t, VEC>(p, cluster, stream)) {
      launch_two_pass(backward_two_pass<scalar_t, VEC, kCausal>, p, VEC, stream);
    }
    return;
  }
  launch_backward_in_registers<scalar_t, VEC, kCausal>(p, plan, stream);
}

template <typename scalar_t, int VEC>
void backward_ladder(const BackwardParams& p, cudaStream_t stream) {
  with_flag(p.is_causal, [&](auto causal) { backward_ladder<scalar_t, VEC, causal()>(p, stream); });
}

// Whether rows that start mid-vector may be read in vectors: dy's and dx's rows start as far into a vector as y's.
template <typename scalar_t, int VEC>
bool gradient_rows_shifted_alike(const BackwardParams& p) {
  constexpr int kBytes = sizeof(scalar_t);
  return rows_shifted_alike(p.y, p.y_strides, kBytes, p.dy, p.dy_strides, kBytes, p.shape, VEC) &&
         rows_shifted_alike(p.y, p.y_strides, kBytes, p.dx, contiguous_row_strides(p.shape, p.output_row_stride),
                            kBytes, p.shape, VEC);
}

// `p` for rows that start mid-vector, with the copies of y's and dy's last bytes (TailCopy) that it reads, held until
// the launch is queued.
struct ShiftedGradient {
  BackwardParams params;
  at::Tensor y_tail;
  at::Tensor dy_tail;
};

template <typename scalar_t, int VEC>
ShiftedGradient shifted_gradient(const BackwardParams& p, cudaStream_t stream) {
  ShiftedGradient shifted{p};
  shifted.y_tail = copy_tail<scalar_t, VEC>(p.y, p.y_end, p.cols, shifted.params.y_tail, stream);
  shifted.dy_tail = copy_tail<scalar_t, VEC>(p.dy, p.dy_end, p.cols, shifted.params.dy_tail, stream);
  return shifted;
}

// Launches backward_in_registers on rows that start mid-vector, as launch_shifted the forward's: where
// gradient_rows_shifted_alike and whole rows fit a block's registers; rows without a causal limit beyond them, and
// within a cluster's, by backward_in_cluster, as backward_ladder launches aligned ones (element by element, fp32 rows
// of 9001 and 10,007 columns took 1.36-1.42 times their floor on an H100, where torch.compile took 1.04-1.14:
// benchmarks/NOTES.md, v133); false otherwise. Not fp64.
template <typename scalar_t, int VEC>
bool launch_backward_shifted(const BackwardParams& p, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4) {
    return false;
  } else {
    if (!gradient_rows_shifted_alike<scalar_t, VEC>(p)) return false;
    return with_flag(p.is_causal, [&](auto causal) {
      const RowPlan plan = shifted_plan(p.cols, VEC, registers_for<scalar_t>(VEC, 2),
                                        backward_target_iters(causal(), shifted_span(p.cols, VEC), VEC));
      const ClusterShape cluster =
          plan.in_registers || causal()
              ? ClusterShape{0, 0, false}
              : split_over_cluster(shifted_span(p.cols, VEC), VEC, backward_max_threads<scalar_t, VEC, kTargetIters>);
      if (!plan.in_registers && !causal() && cluster.blocks_per_row == 0) return false;
      const ShiftedGradient shifted = shifted_gradient<scalar_t, VEC>(p, stream);
      if (plan.in_registers) {
        launch_backward_in_registers<scalar_t, VEC, causal(), /*kShifted=*/true>(shifted.params, plan, stream);
        return true;
      }
      if constexpr (causal()) {
        launch_two_pass(backward_two_pass<scalar_t, VEC, /*kCausal=*/true, /*kShifted=*/true>, shifted.params, VEC,
                        stream);
        return true;
      } else {
        return launch_gradient_in_cluster<scalar_t, VEC, /*kShifted=*/true>(shifted.params, cluster, stream);
      }
    });
  }
}

// The ladder of rows that are not all whole vectors from a vector boundary: causal rows of
// kUnalignedNarrowedFromColumns or more narrowed first where backward_ladder's would be at half their keys, then flat
// runs, or in vectors where launch_backward_shifted takes them, element by element otherwise. Narrowed only in the
// element-by-element ladder, causal rows of 9001 columns that see up to 1024 keys took 1.3 times their floor in bf16
// (in vectors, whole) and 3.1 in fp32; narrowed here, 1.18 and 1.07 (an H100; benchmarks/NOTES.md, v132-v135).
template <typename scalar_t, int VEC>
void unaligned_backward_ladder(const BackwardParams& p, cudaStream_t stream) {
  const auto launch_narrowed = [&](const BackwardParams& narrowed) {
    unaligned_backward_ladder<scalar_t, VEC>(narrowed, stream);
  };
  const bool narrowed = with_flag(p.is_causal, [&](auto causal) {
    return p.cols >= kUnalignedNarrowedFromColumns && narrowed_at_half<scalar_t, VEC, causal()>(p) &&
           narrowed_to_visible(p, static_cast<scalar_t*>(p.dx), kHalfNarrowedParts, stream, launch_narrowed);
  });
  if (!narrowed && !launch_backward_flat<scalar_t, VEC>(p, stream) &&
      !launch_backward_shifted<scalar_t, VEC>(p, stream)) {
    backward_ladder<scalar_t, 1>(p, stream);
  }
}

at::Tensor backward_cuda(const at::Tensor& y, const at::Tensor& dy, double scale, bool is_causal,
                         c10::string_view causal_variant) {
  const c10::cuda::CUDAGuard device_guard(y.device());
  BackwardParams p;
  BackwardOperands operands = make_backward_params(
      y, dy, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  if (p.rows == 0) return operands.dx;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "scaled_mask_softmax_backward", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool aligned = p.cols % kVec == 0 &&
                         rows_aligned(p.y, p.y_strides, p.shape, kVec, sizeof(scalar_t)) &&
                         rows_aligned(p.dy, p.dy_strides, p.shape, kVec, sizeof(scalar_t));
    if (aligned) {
      backward_ladder<scalar_t, kVec>(p, stream);
    } else {
      unaligned_backward_ladder<scalar_t, kVec>(p, stream);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return operands.dx;
}

// Launches backward_with_bias_grad where a block's registers hold the rows, with parts enough of each bias row's
// rows (make_bias_grad_parts) for the groups to fill the device: their sums into `sums`. False otherwise.
// kShifted: rows that start mid-vector, where groups of lanes or a warp hold them (shifted_plan).
template <typename scalar_t, int VEC, bool kCausal, bool kShifted = false>
bool launch_backward_with_bias_grad(const at::Tensor& y, int64_t bias_rows, const BackwardParams& p, at::Tensor& sums,
                                    cudaStream_t stream) {
  constexpr int kRegisters = bias_grad_registers_per_vector<scalar_t, VEC>;
  const int target_iters = backward_target_iters(kCausal);
  const RowPlan plan = kShifted ? shifted_plan(p.cols, VEC, kRegisters, target_iters)
                                : plan_block(p.cols, VEC, kRegisters, target_iters);
  // Rows that start mid-vector: where groups of lanes or a warp hold them; past kTargetIters vectors a thread, in
  // 16-bit types only (fp32 rows at seven spilled 4 bytes: ptxas, sm_90).
  constexpr bool kPastTargetToo = !kShifted || sizeof(scalar_t) == 2;
  if (!plan.in_registers || (kShifted && (plan.width > kWarp || (plan.iters > kTargetIters && !kPastTargetToo)))) {
    return false;
  }
  ShiftedGradient launched{p};
  if constexpr (kShifted) launched = shifted_gradient<scalar_t, VEC>(p, stream);
  BackwardParams& params = launched.params;
  const auto launch = [&](auto iters) {
    constexpr int kIters = decltype(iters)::value;
    if constexpr (kIters <= kTargetIters || kPastTargetToo) {
      const auto kernel = backward_with_bias_grad<scalar_t, VEC, kIters, kCausal, kShifted>;
      const int64_t resident_groups = int64_t{resident_blocks(kernel, plan.threads)} *
                                      device_attribute(cudaDevAttrMultiProcessorCount) * (plan.threads / plan.width);
      sums = make_bias_grad_parts(y, bias_rows, resident_groups, params);
      kernel<<<blocks_for(params.bias_grad_rows, plan), plan.threads, 0, stream>>>(params, plan.width);
    }
  };
  if constexpr (kShifted) {
    if (plan.iters > kTargetIters) {
      with_past_target_iters(plan.iters, launch);
      return true;
    }
  }
  with_iters(plan.iters, launch);
  return true;
}

// Launches backward_with_bias_grad_in_cluster where a cluster's registers (kTargetIters vectors a thread) hold the
// rows, with parts enough of each bias row's rows for the clusters to fill the device; false otherwise, and for fp64.
template <typename scalar_t, int VEC, bool kCausal>
bool launch_backward_with_bias_grad_in_cluster(const at::Tensor& y, int64_t bias_rows, const BackwardParams& p,
                                               at::Tensor& sums, cudaStream_t stream) {
  if constexpr (sizeof(scalar_t) > 4) {
    return false;
  } else {
    const ClusterShape shape =
        split_over_cluster(p.cols, VEC, bias_grad_max_threads<scalar_t, VEC, kTargetIters>);
    if (shape.blocks_per_row == 0 || shape.wide) return false;
    const auto kernel = backward_with_bias_grad_in_cluster<scalar_t, VEC, kCausal>;
    const int64_t resident_clusters = int64_t{resident_blocks(kernel, shape.threads)} *
                                      device_attribute(cudaDevAttrMultiProcessorCount) / shape.blocks_per_row;
    BackwardParams params = p;
    sums = make_bias_grad_parts(y, bias_rows, resident_clusters, params);
    return launch_clusters_over(kernel, params, params.bias_grad_rows, shape.blocks_per_row, shape.threads, stream);
  }
}

std::tuple<at::Tensor, at::Tensor> backward_with_bias_grad_cuda(const at::Tensor& y, const at::Tensor& dy,
                                                                double scale, bool is_causal,
                                                                c10::string_view causal_variant, int64_t bias_rows) {
  const c10::cuda::CUDAGuard device_guard(y.device());
  BackwardParams p;
  BackwardOperands operands = make_backward_params(
      y, dy, scale, is_causal, std::string_view(causal_variant.data(), causal_variant.size()), p);
  check_bias_rows(bias_rows, p);
  if (p.rows == 0) return {operands.dx, zero_bias_grad(y, bias_rows, p)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor sums;
  bool launched = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "scaled_mask_softmax_backward", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool aligned = p.cols % kVec == 0 &&
                         rows_aligned(p.y, p.y_strides, p.shape, kVec, sizeof(scalar_t)) &&
                         rows_aligned(p.dy, p.dy_strides, p.shape, kVec, sizeof(scalar_t));
    with_flag(p.is_causal, [&](auto causal) {
      // Rows read in vectors of `vec`: in a block's registers, else in a cluster's.
      const auto in_registers = [&](auto vec) {
        constexpr int kRowVec = decltype(vec)::value;
        launched = launch_backward_with_bias_grad<scalar_t, kRowVec, causal()>(y, bias_rows, p, sums, stream) ||
                   launch_backward_with_bias_grad_in_cluster<scalar_t, kRowVec, causal()>(y, bias_rows, p, sums,
                                                                                          stream);
      };
      if (aligned) return in_registers(std::integral_constant<int, kVec>{});
      if constexpr (sizeof(scalar_t) <= 4) {
        launched = launch_backward_flat_with_bias_grad<scalar_t, kVec>(y, bias_rows, p, sums, stream);
        if (!launched && gradient_rows_shifted_alike<scalar_t, kVec>(p)) {
          launched = launch_backward_with_bias_grad<scalar_t, kVec, causal(), /*kShifted=*/true>(y, bias_rows, p, sums,
                                                                                               stream);
        }
      }
      if (!launched) in_registers(std::integral_constant<int, 1>{});
    });
  });
  if (!launched) {
    // Rows beyond a cluster's registers, and fp64 rows beyond a block's: the score gradients apart, in the compute
    // type, summed by ATen, then scaled in place into dx, rounded once (one pass over y and dy where two were).
    const auto compute_type = at::toOpMathType(y.scalar_type());
    at::Tensor score_grad =
        backward_cuda(operands.y.to(compute_type), operands.dy.to(compute_type), 1.0, is_causal, causal_variant);
    at::Tensor bias_grad = score_grad.reshape({-1, bias_rows, p.cols}).sum(0);
    operands.dx.copy_(score_grad.mul_(scale));
    return {operands.dx, bias_grad};
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {operands.dx, bias_grad_of_parts(sums)};
}

}  // namespace

TORCH_LIBRARY_IMPL(scaled_mask_softmax, CUDA, m) {
  m.impl("backward", &backward_cuda);
  m.impl("backward_with_bias_grad", &backward_with_bias_grad_cuda);
}

}  // namespace sms
