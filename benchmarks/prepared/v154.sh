#!/usr/bin/env bash
# v154 on one machine, one build (benchmarks/NOTES.md, "v154"): most_resident_wide's search of 5-16 blocks against
# main's 5-8 (SMS_WIDE_MOST_BLOCKS=8), the forward's and the backward's wide rows; the chosen launches printed.
# Pack here first:
#   scripts/variants.sh pack benchmarks/prepared/v154-wide-cluster-counts-to-16.patch
# There (carry [".variants"]), one call:
#   OUT=$OUT bash benchmarks/prepared/v154.sh   built, its cluster tests, the cells under both searches (ROUNDS=1); ~300 s
source "$(dirname "$0")/compare.sh"
build_then_test v154-wide-cluster-counts-to-16 "cluster or mid_vector or very_long"
sweep() {
  CONFIGS="eight:SMS_WIDE_MOST_BLOCKS=8" ROUNDS="${ROUNDS:-1}" OUT="$OUT" scripts/variants.sh sweep --launches "$@"
}
# By the model in NOTES: bf16 131,077 (16,386 vectors) from 5 blocks of 13 warps, one a multiprocessor, to 9 of 8,
# two, and more clusters at once; 150,001 to 10 blocks of 8 warps and 200,003 to 16 of 7, two a multiprocessor, as
# many clusters at once as before; fp32 65,539 stays at 8 blocks of 10 warps, two a multiprocessor.
sweep --passes fwd --variants additive,key_padding --grid 1x2x256x131077,1x2x256x150001 --dtypes bfloat16
sweep --passes bwd --variants none --grid 1x2x256x131077,1x2x256x150001 --dtypes bfloat16
sweep --passes fwd --variants additive --grid 1x2x256x200003 --dtypes bfloat16
sweep --passes fwd --variants additive --grid 1x4x512x65539 --dtypes float32
