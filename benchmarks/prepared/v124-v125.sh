#!/usr/bin/env bash
# v124 and v125 against main on the GPU machine (benchmarks/NOTES.md, "v125"), in two calls of about 300 s each.
# Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v124-flat-forward-with-following-masks.patch \
#     benchmarks/prepared/v125-flat-forward-loads-first.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v124-v125.sh build, then ... measure.
# Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
trees=(main v124-flat-forward-with-following-masks v125-flat-forward-loads-first)
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:?build or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build
    for tree in "${trees[@]:1}"; do
      echo "tests $tree: $(cd "/tmp/variants/$tree" && python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_cuda.py -k "flat or mid_vector or learnable" 2>&1 | tail -n 1)"
    done
    NAMES="${trees[2]}" OUT="$OUT" scripts/variants.sh memcheck ;;
  measure)
    NAMES="${trees[*]}" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1024x4x49x49,512x8x33x33 \
      --dtypes bfloat16,float16 --passes fwd
    for tree in main "${trees[2]}"; do
      echo "learnable $tree:"
      PYTHONPATH="/tmp/variants/$tree" python3 benchmarks/learnable_bias.py --shape 1024x4x49x49 --kernels 2>&1 |
        tail -n 4
    done ;;
esac
