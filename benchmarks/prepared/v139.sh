#!/usr/bin/env bash
# v139 against main on the GPU machine (benchmarks/NOTES.md, "v139"; a patch on main), in two calls of about 250 s
# each on an H100. Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v139-shifted-staged-in-cluster.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v139.sh build, then ... measure. Its own lines
# go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v139=v139-shifted-staged-in-cluster
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:?build or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build ;;
  measure)
    echo "tests $v139: $(cd "/tmp/variants/$v139" && timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/test_cuda.py -k "mid_vector and not causal" 2>&1 | tail -n 1)"
    NAMES="$v139" OUT="$OUT" scripts/variants.sh memcheck
    # Rows that start mid-vector past a block's registers, without a causal limit: without a mask staged over a
    # cluster's blocks (v139) or held in their registers (main); key padding and an additive mask unchanged. The
    # aligned rows of 65,536 columns, the same in both, for what staging gives them.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x16x1024x20001,1x4x512x65539,1x4x512x65536,1x2x256x131077 \
      --dtypes bfloat16,float32 --variants none,key_padding --passes fwd ;;
esac
