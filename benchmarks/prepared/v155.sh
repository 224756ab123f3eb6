#!/usr/bin/env bash
# v155 on one machine, one build (benchmarks/NOTES.md, "v155"): most_resident_wide ranking each count of 5-16 blocks
# by the rows resident, twice where a multiprocessor holds two blocks or more, against v154's warps resident
# (SMS_WIDE_RANK=warps) and main's search (that and SMS_WIDE_MOST_BLOCKS=8); the chosen launches printed.
# Pack here first:
#   scripts/variants.sh pack benchmarks/prepared/v155-wide-cluster-rows-at-two-blocks.patch
# There (carry [".variants"]), one call:
#   OUT=$OUT bash benchmarks/prepared/v155.sh   built, its cluster tests, the cells under the three rankings; ~330 s
source "$(dirname "$0")/compare.sh"
build_then_test v155-wide-cluster-rows-at-two-blocks "cluster or mid_vector or very_long"
sweep() {
  CONFIGS="warps:SMS_WIDE_RANK=warps main:SMS_WIDE_RANK=warps,SMS_WIDE_MOST_BLOCKS=8" ROUNDS="${ROUNDS:-2}" OUT="$OUT" \
    scripts/variants.sh sweep --launches "$@"
}
sweep --passes fwd,bwd --variants none,additive,key_padding --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 \
  --dtypes bfloat16
sweep --passes fwd,bwd --variants additive,key_padding --grid 1x4x512x65539,1x2x256x100000 --dtypes float32
