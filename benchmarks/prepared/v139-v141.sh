#!/usr/bin/env bash
# v139, v140 and v141 against main on the GPU machine (benchmarks/NOTES.md, "v139", "v140", "v141"; each a patch on
# main), in three calls of about 300 s each on an H100. Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v139-shifted-staged-in-cluster.patch \
#     benchmarks/prepared/v140-shifted-staged-with-mask.patch benchmarks/prepared/v141-shifted-backward-staged.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v139-v141.sh build, then ... test, then
# ... measure. Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its
# actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v139=v139-shifted-staged-in-cluster
v140=v140-shifted-staged-with-mask
v141=v141-shifted-backward-staged
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
gpu_tests() {  # tree, pytest's -k
  (cd "/tmp/variants/$1" && timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -k "$2" \
     2>&1 | tail -n 1)
}
case "${1:?build, test or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build ;;
  test)
    echo "tests $v139: $(gpu_tests "$v139" "mid_vector and not causal")"
    echo "tests $v140: $(gpu_tests "$v140" "mid_vector and staged")"
    echo "tests $v141: $(gpu_tests "$v141" "mid_vector and staged")"
    NAMES="$v139 $v140 $v141" OUT="$OUT" scripts/variants.sh memcheck ;;
  measure)
    # v139's cells: rows that start mid-vector past a block's registers, without a causal limit: without a mask
    # staged over a cluster's blocks (v139) or held in their registers (main); key padding unchanged. The aligned
    # rows of 65,536 columns, the same in every tree, for what staging gives them.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x16x1024x20001,1x4x512x65539,1x4x512x65536,1x2x256x131077 \
      --dtypes bfloat16,float32 --variants none,key_padding --passes fwd
    # v140's: rows that start mid-vector with a bias or a full mask alike, staged (v140) or not (main).
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x4x9001x9001,2x4x4099x4099 --dtypes bfloat16,float32 \
      --variants causal_bias --passes fwd
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x16x1024x12001 --dtypes bfloat16 \
      --variants none,additive,bias --passes fwd
    # v141's: the backward of causal rows that start mid-vector in two blocks a multiprocessor, staged (v141) or not.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x4x12001x12001,1x4x7001x7001 --dtypes bfloat16,float32 \
      --variants causal --passes bwd ;;
esac
