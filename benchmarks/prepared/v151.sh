#!/usr/bin/env bash
# v151 against main on one machine (benchmarks/NOTES.md, "v151"): 16-bit rows at eight vectors a thread held by
# forward_in_cluster_wide in 112 registers a thread, where forward_in_cluster's took 114-128, so that two blocks of up
# to 288 threads fit a multiprocessor; both builds, two rounds. Pack here first:
#   scripts/variants.sh pack main benchmarks/prepared/v151-wide-cluster-registers.patch
# There (carry [".variants"]), two calls on one warm machine:
#   OUT=$OUT bash benchmarks/prepared/v151.sh build   both built (side by side), v151's cluster tests; ~450 s
#   OUT=$OUT bash benchmarks/prepared/v151.sh sweep   the cells; about 120 s
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:-}" in
  build)
    OUT="$OUT" scripts/variants.sh ensure
    NAMES=v151-wide-cluster-registers OUT="$OUT" scripts/variants.sh test tests/test_cuda.py -m gpu \
      -k "cluster or mid_vector or very_long" ;;
  sweep)
    sweep() { ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --passes fwd --variants additive,key_padding,bias "$@"; }
    # Moved (main: 5 blocks of 13 warps, one a multiprocessor): 131,077 over 8 blocks of 9 warps, two a
    # multiprocessor. As they were (one block a multiprocessor at every count, 112 registers or 127): 150,001 and
    # 200,003. fp32 65,539: the same kernels in both builds, the control.
    sweep --grid 1x2x256x131077,1x2x256x150001,1x2x256x200003 --dtypes bfloat16
    sweep --grid 1x2x256x131077 --dtypes float16
    sweep --grid 1x4x512x65539 --dtypes float32 ;;
  *) echo "usage: v151.sh build | sweep" >&2; exit 2 ;;
esac
