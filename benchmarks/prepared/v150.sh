#!/usr/bin/env bash
# v150 against the tree before it on one machine (benchmarks/NOTES.md, "v150"): the forward's wide register kernels
# in the block count that keeps the most warps resident, on rows that start mid-vector with a mask (the rows no staged
# kernel takes), both builds, two rounds. Pack here first:
#   scripts/variants.sh pack 9987d8b main        (9987d8b: main just before v150)
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v150.sh build   both built (side by side), main's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v150.sh sweep   the cells; about 150 s
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test main "cluster or mid_vector or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --passes fwd --variants additive,key_padding,bias "$@"; }
    # 9987d8b takes 8 blocks in each. A model of the GPCs (of 12-18 multiprocessors) says: bf16 131,077 and 150,001
    # over 5, fp32 65,539 over 7; the others over 8, as before.
    sweep --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 --dtypes bfloat16
    sweep --grid 1x4x512x65539,1x2x256x80001,1x2x256x100003 --dtypes float32 ;;
  *) echo "usage: v150.sh build | sweep" >&2; exit 2 ;;
esac
