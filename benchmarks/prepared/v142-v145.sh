#!/usr/bin/env bash
# v142, v143, v144 and v145 against main on the GPU machine (benchmarks/NOTES.md, "v142" to "v145"; each a patch on
# main but v145, on v144), in two calls on an H100: `build test` (about 500 s), then `measure` (about 300 s). v144 is
# not built on its own: v145's tree holds both, and their cells are apart (v144 the staged forwards, v145 the
# backwards and the forwards of a full mask of rows that start mid-vector, which the staged kernel does not take).
# Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v142-shifted-key-padding-staged-in-cluster.patch \
#     benchmarks/prepared/v143-shifted-two-pass-past-a-cluster.patch \
#     benchmarks/prepared/v145-wide-cluster-fewest-blocks.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v142-v145.sh build test, then ... measure.
# Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v142=v142-shifted-key-padding-staged-in-cluster
v143=v143-shifted-two-pass-past-a-cluster
v145=v145-wide-cluster-fewest-blocks
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
gpu_tests() {  # tree, pytest's -k
  (cd "/tmp/variants/$1" && timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -k "$2" \
     2>&1 | tail -n 1)
}
for action in "${@:?build, test or measure}"; do
  case "$action" in
    build)
      OUT="$OUT" scripts/variants.sh build ;;
    test)
      echo "tests $v142: $(gpu_tests "$v142" "mid_vector and not causal")"
      echo "tests $v143: $(gpu_tests "$v143" "mid_vector and (long or past)")"
      echo "tests $v145: $(gpu_tests "$v145" \
        "very_long or long_rows or cluster or one_stage or (mid_vector and not causal)")"
      NAMES="$v142 $v143 $v145" OUT="$OUT" scripts/variants.sh memcheck ;;
    measure)
      export NAMES="main $v142 $v143 $v145"
      # v142's cells: rows that start mid-vector past a block's registers, without a causal limit, with a bool key
      # mask read from global memory beside x staged over a cluster's blocks (v142) or held in their registers (main);
      # without a mask the same in both (staged, v139), but in fewer blocks at 65,539 and 131,077 (v144, in v145's
      # tree). The aligned rows of 65,536 columns for the floor's reach.
      ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x16x1024x20001,1x4x512x65539,1x4x512x65536,1x2x256x131077 --dtypes bfloat16,float32 \
        --variants none,key_padding --passes fwd
      # v143's: rows that start mid-vector past a cluster's registers, in two passes over a cluster's slices in
      # vectors (v143) or element by element (main); the aligned bf16 rows of 262,144 columns beside them.
      ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x1x512x262147,1x1x512x262144 --dtypes bfloat16 \
        --variants none,key_padding,additive --passes fwd
      ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x2x256x131077 --dtypes float32 --variants additive \
        --passes fwd
      # v144's: rows whose fewest staged blocks are no power of two (3 at 90,000 bf16 and 40,001 fp32 columns, 7 at
      # 100,000 fp32), where main takes the next power of two (4, 4, 8).
      NAMES="main $v145" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x4x512x90000,1x4x512x40001,1x2x256x100000 --dtypes bfloat16,float32 --variants none,key_padding,bias \
        --passes fwd
      # v145's: rows past 8 blocks' registers at four vectors a thread, held in 5-7 blocks at eight (v145) or 8
      # (main): fp32 at 65,539 and 100,000 columns, bf16 at 131,077 and 131,080; backwards, and the forwards
      # that the staged kernel does not take (a full mask of rows that start mid-vector); aligned 131,072 fp32 (8 in
      # both) beside them.
      NAMES="main $v145" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x4x512x65539,1x2x256x100000,1x2x256x131072 --dtypes float32 --variants none,bias --passes bwd
      NAMES="main $v145" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x2x256x131077,1x2x256x131080 --dtypes bfloat16 --variants none,bias --passes bwd
      NAMES="main $v145" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x4x512x65539,1x2x256x131077 --dtypes float32,bfloat16 --variants additive --passes fwd ;;
    *) echo "unknown action $action" >&2; exit 2 ;;
  esac
done
