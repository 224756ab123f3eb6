#!/usr/bin/env bash
# v158 against main on one machine (benchmarks/NOTES.md, "v158"): scores formed twice (kReformsScores) only in the
# causal kernels at four vectors a thread that reduce once or start mid-vector, where ptxas spills without it; both
# built side by side, two rounds. Pack here first:
#   scripts/variants.sh pack main benchmarks/prepared/v158-reform-only-where-it-spills.patch
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v158.sh build   both built (side by side), the patch's causal tests; ~400 s
#   OUT=$OUT bash benchmarks/prepared/v158.sh sweep   the cells; about 320 s
# Its cells and v157's are apart: packed as one build (main v157...patch+v158...patch), one build and sweep serve both.
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test v158-reform-only-where-it-spills "causal" ;;
  sweep)
    # 16-bit rows of 128-4096 columns at four vectors a thread in groups of lanes, a warp or blocks of up to 128
    # threads (two reductions): without a mask (bf16 reformed before), causal without a mask or with a bool one.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --passes fwd \
      --variants none,causal,causal_key_padding --dtypes float16,bfloat16 \
      --grid 256x16x128x128,16x16x512x512,8x32x1024x1024,2x16x4096x4096 ;;
  *) echo "usage: v158.sh build | sweep" >&2; exit 2 ;;
esac
