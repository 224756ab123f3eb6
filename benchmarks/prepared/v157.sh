#!/usr/bin/env bash
# v157 against main on one machine (benchmarks/NOTES.md, "v157"): 16-bit rows at eight vectors a thread in a cluster
# with a full mask, a bias or a key mask written out alike, held in 96 registers a thread (forward_in_cluster_wide),
# so that a multiprocessor holds 20 of their warps where it held 16; both built side by side, two rounds.
# Pack here first:
#   scripts/variants.sh pack main benchmarks/prepared/v157-wide-cluster-in-96-registers.patch
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v157.sh build   both built (side by side), the patch's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v157.sh sweep   the cells, the launches printed; about 200 s
source "$(dirname "$0")/compare.sh"
case "${1:-}" in
  build)
    build_then_test v157-wide-cluster-in-96-registers "cluster or mid_vector or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --launches "$@"; }
    # Moved: the forward's 16-bit wide rows with a 16-bit mask or a key mask (131,077-200,003 columns start mid-vector,
    # 512 rows: the key mask is written out alike). The control: fp32 65,539 (the same kernels in both builds).
    fwd() { sweep --passes fwd --variants additive,key_padding,bias "$@"; }
    fwd --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 --dtypes bfloat16
    fwd --grid 1x2x256x131077 --dtypes float16
    fwd --grid 1x4x512x65539 --dtypes float32 ;;
  *) echo "usage: v157.sh build | sweep" >&2; exit 2 ;;
esac
