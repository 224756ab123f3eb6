#!/usr/bin/env bash
# v153 against main on one machine (benchmarks/NOTES.md, "v153"): forward_in_cluster's clusters bring the slices of
# the row a later cluster will take into L2 (bulk prefetches) before their own loads; v150's cells, two rounds.
# Pack here first:
#   scripts/variants.sh pack main benchmarks/prepared/v153-cluster-rows-ahead-in-l2.patch
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v153.sh build   both built (side by side), the patch's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v153.sh sweep   the cells; about 120 s
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test v153-cluster-rows-ahead-in-l2 "cluster or mid_vector or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --passes fwd --variants additive,key_padding,bias "$@"; }
    # One block a multiprocessor: bf16 at all three lengths, fp32 at 100,003; two: fp32 65,539 and 80,001.
    sweep --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 --dtypes bfloat16
    sweep --grid 1x4x512x65539,1x2x256x80001,1x2x256x100003 --dtypes float32 ;;
  *) echo "usage: v153.sh build | sweep" >&2; exit 2 ;;
esac
