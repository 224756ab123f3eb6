#!/usr/bin/env bash
# v149 against the tree before it, on one machine (benchmarks/NOTES.md, "v149"): the staged forward's cells that the
# busiest block count moves, and some it leaves as they were, in both builds, two rounds. Pack here first:
#   scripts/variants.sh pack 2fc0f4c main        (2fc0f4c: main just before v149)
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v149-h200.sh build   both built (side by side), main's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v149-h200.sh sweep   the cells; about 200 s
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test main "cluster or mid_vector or staged or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --passes fwd "$@"; }
    # Moved: bf16 65,539 4 -> 3 blocks, 131,077 8 -> 5, 200,000 and 100,000 8 and 4 -> 7; fp32 100,000 8 -> 7.
    # As they were: bf16 80,000 and 90,000 (4), fp32 110,000 and 90,000 (8).
    sweep --grid 1x4x512x65539,1x2x256x131077,1x2x256x80000 --dtypes bfloat16 --variants none
    sweep --grid 1x2x256x200000,1x2x256x100000,1x4x512x90000 --dtypes bfloat16 --variants none,key_padding,bias
    sweep --grid 1x2x256x100000 --dtypes float32 --variants none,key_padding,bias
    sweep --grid 1x2x256x110000,1x4x512x90000 --dtypes float32 --variants none ;;
  *) echo "usage: v149-h200.sh build | sweep" >&2; exit 2 ;;
esac
