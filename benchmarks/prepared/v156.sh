#!/usr/bin/env bash
# v156 on one machine, one build (benchmarks/NOTES.md, "v156"): most_resident_wide's ties broken to the most blocks
# (SMS_WIDE_TIE=most) against main's fewest; the chosen launches printed.
# Pack here first:
#   scripts/variants.sh pack benchmarks/prepared/v156-wide-ties-to-most-blocks.patch
# There (carry [".variants"]), one call:
#   OUT=$OUT bash benchmarks/prepared/v156.sh   built, its cluster tests, the cells under both tie-breaks; ~300 s
source "$(dirname "$0")/compare.sh"
build_then_test v156-wide-ties-to-most-blocks "cluster or mid_vector or very_long"
CONFIGS="most:SMS_WIDE_TIE=most" ROUNDS="${ROUNDS:-2}" OUT="$OUT" scripts/variants.sh sweep --launches \
  --passes fwd,bwd --variants additive,key_padding --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 \
  --dtypes bfloat16
CONFIGS="most:SMS_WIDE_TIE=most" ROUNDS="${ROUNDS:-2}" OUT="$OUT" scripts/variants.sh sweep --launches \
  --passes fwd,bwd --variants additive,key_padding --grid 1x4x512x65539,1x2x256x100000 --dtypes float32
