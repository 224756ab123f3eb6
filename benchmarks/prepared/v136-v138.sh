#!/usr/bin/env bash
# v136, v137 and v138 against main on the GPU machine (benchmarks/NOTES.md, "v136", "v137", "v138"; each a patch on
# main), in three calls of about 300 s each on an H100. Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v136-shifted-two-pass-without-additive-mask.patch \
#     benchmarks/prepared/v137-unaligned-narrowed-from-2048.patch benchmarks/prepared/v138-shifted-staged.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v136-v138.sh build, then ... test, then
# ... measure. Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v136=v136-shifted-two-pass-without-additive-mask
v137=v137-unaligned-narrowed-from-2048
v138=v138-shifted-staged
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
gpu_tests() {  # tree, pytest's -k
  (cd "/tmp/variants/$1" && python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py -k "$2" 2>&1 | tail -n 1)
}
case "${1:?build, test or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build ;;
  test)
    echo "tests $v136: $(gpu_tests "$v136" "mid_vector or long")"
    echo "tests $v137: $(gpu_tests "$v137" "narrowed or unaligned or see or nan")"
    echo "tests $v138: $(gpu_tests "$v138" "mid_vector or staged or see or nan or causal")" ;;
  measure)
    NAMES="$v136 $v138" OUT="$OUT" scripts/variants.sh memcheck
    # v136's cells: forwards past a block's registers that start mid-vector, without a mask or with a bool one
    # (forward_in_cluster in main; two passes over a cluster's slices in v136); with an additive mask, unchanged.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x16x1024x20001,1x4x512x65539,1x2x256x131077 \
      --dtypes bfloat16,float32 --variants none,key_padding,additive --passes fwd
    # v137's cells: upper-left causal rows that see at most half their keys, whole (main) or narrowed (v137); and
    # v138's: causal rows without a mask, staged from the vector boundary before each row (v138) or not (main).
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 8x4x1000x2051,4x4x1000x4099,3x4x1000x6145,2x4x1000x8191 \
      --dtypes bfloat16,float32 --variants causal --passes fwd,bwd
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x4x9001x9001,2x4x4099x4099 --dtypes bfloat16,float32 \
      --variants causal --passes fwd ;;
esac
