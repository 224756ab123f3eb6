#!/usr/bin/env bash
# v151 and v152 against main on one machine (benchmarks/NOTES.md, "v151", "v152"): rows at eight vectors a thread in
# a cluster held in 112 registers a thread where the bounds of one block a multiprocessor gave 114-128, so that two
# blocks of up to 288 threads fit a multiprocessor: 16-bit rows in the forward (v151), 16-bit and fp32 rows in the
# backward, whose count is then the one that keeps the most warps resident (v152); one build of both, two rounds.
# Pack here first:
#   scripts/variants.sh pack main benchmarks/prepared/v151-v152-wide-cluster-registers.patch
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v151-v152.sh build   both built (side by side), the patch's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v151-v152.sh sweep   the cells; about 150 s
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test v151-v152-wide-cluster-registers "cluster or mid_vector or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep "$@"; }
    # v151, moved (main: 5 blocks of 13 warps, one a multiprocessor): 16-bit 131,077 over 8 blocks of 9 warps, two a
    # multiprocessor. As they were (one block a multiprocessor at every count): 150,001 and 200,003. fp32 65,539:
    # the same kernels in both builds, the control.
    fwd() { sweep --passes fwd --variants additive,key_padding,bias "$@"; }
    fwd --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 --dtypes bfloat16
    fwd --grid 1x2x256x131077 --dtypes float16
    fwd --grid 1x4x512x65539 --dtypes float32
    # v152, moved: bf16 131,077 and fp32 65,539 from 5 blocks (one a multiprocessor) to 8 (two); fp32 100,000 from 7
    # to 8 (one at either). As they were: bf16 150,000 (5).
    sweep --passes bwd --variants none --grid 1x2x256x131077,1x2x256x150000 --dtypes bfloat16
    sweep --passes bwd --variants none --grid 1x4x512x65539,1x2x256x100000 --dtypes float32 ;;
  *) echo "usage: v151-v152.sh build | sweep" >&2; exit 2 ;;
esac
