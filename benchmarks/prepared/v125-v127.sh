#!/usr/bin/env bash
# v125, v126 and v127 against main on the GPU machine (benchmarks/NOTES.md, "v125", "v126" and "v127"), in two calls
# of about 400 and 300 s. Each patch holds its tree's commits on main (v125's v124's too, v127's v126's). Packed here
# first:
#   scripts/variants.sh pack main benchmarks/prepared/v125-flat-forward-loads-first.patch \
#     benchmarks/prepared/v126-mask-repeated-alike.patch benchmarks/prepared/v127-shifted-mask-copies.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v125-v127.sh build, then ... measure.
# Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v125=v125-flat-forward-loads-first v126=v126-mask-repeated-alike v127=v127-shifted-mask-copies
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:?build or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build
    for tree in "$v125" "$v126" "$v127"; do
      echo "tests $tree: $(cd "/tmp/variants/$tree" && python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_cuda.py -k "flat or mid_vector or learnable or repeated or shifted" 2>&1 | tail -n 1)"
    done
    NAMES="$v125 $v127" OUT="$OUT" scripts/variants.sh memcheck ;;
  measure)
    # 64x16x197x197: every batch starts a whole number of vectors into x (16 * 197 * 197 = 0 mod 8), where at 12
    # heads every other one does not: main's figures there say whether the batches' shifts cost what v126 removes.
    NAMES="main $v125 $v126 $v127" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
      --grid 1024x4x49x49,512x8x33x33,64x12x197x197,64x16x197x197 --dtypes bfloat16 --passes fwd \
      --variants none,additive,key_padding,bias
    for tree in main "$v125" "$v127"; do
      echo "learnable $tree:"
      PYTHONPATH="/tmp/variants/$tree" python3 benchmarks/learnable_bias.py --shape 1024x4x49x49 --kernels 2>&1 |
        tail -n 4
    done ;;
esac
