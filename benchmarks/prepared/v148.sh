#!/usr/bin/env bash
# v148 on the GPU machine (benchmarks/NOTES.md, "v148"): v147's build (benchmarks/prepared/v147.sh builds it; a
# machine kept warm keeps it, otherwise this builds it first, about 260 s) swept under each forced block count: the
# staged forward's (SMS_STAGED_BLOCKS, 2-8; at least the fewest that hold the row) on rows without a mask, and the
# wide register kernels' (SMS_WIDE_BLOCKS, 5-8) in the backward and with a floating mask. About 300 s.
# There (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v148.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" scripts/variants.sh ensure
sweep() {
  local configs="$1"
  shift
  CONFIGS="$configs" ROUNDS="${ROUNDS:-2}" OUT="$OUT" scripts/variants.sh sweep "$@"
}
staged="" wide=""
for n in 2 3 4 5 6 7 8; do staged+="s$n:SMS_STAGED_BLOCKS=$n "; done
for n in 5 6 7 8; do wide+="w$n:SMS_WIDE_BLOCKS=$n "; done
# The fewest staged blocks: 3 at 65,539 and 80,000 bf16, 5 at 131,077, 7 at 200,000; 7 at 110,000 and 100,000 fp32,
# 6 at 90,000. Main takes 4, 8, 8, 4; 8, 8, 8.
sweep "$staged" --grid 1x4x512x65539,1x2x256x131077,1x2x256x200000,1x2x256x80000 --dtypes bfloat16 --variants none \
  --passes fwd
sweep "$staged" --grid 1x2x256x110000,1x2x256x100000,1x4x512x90000 --dtypes float32 --variants none --passes fwd
# The fewest wide blocks in the backward: 5 at fp32 65,539 and bf16 131,077 and 150,000, 7 at fp32 100,000 (both
# dtypes swept at each length, in one call a setting: the other dtype's rows are extra cells).
sweep "$wide" --grid 1x4x512x65539,1x2x256x100000,1x2x256x131077,1x2x256x150000 --dtypes float32,bfloat16 \
  --variants none --passes bwd
# The forward's wide rows that no staged kernel takes: a floating mask on rows that start mid-vector
# (forward_in_cluster; 5 blocks at fewest at fp32 65,539 and bf16 131,077, where v145 measured mixed; main takes 8).
sweep "$wide" --grid 1x4x512x65539,1x2x256x131077 --dtypes float32,bfloat16 --variants additive --passes fwd
