#!/usr/bin/env bash
# v128 and v129 against main on the GPU machine (benchmarks/NOTES.md, "v128" and "v129"), in two calls of about 300
# and 250 s. Each patch holds its tree's commits on main (v129's v128's too). Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v128-mask-as-far-into-its-vectors.patch \
#     benchmarks/prepared/v129-bias-repeated-alike.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v128-v129.sh build, then ... measure.
# Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v128=v128-mask-as-far-into-its-vectors v129=v129-bias-repeated-alike
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:?build or measure}" in
  build)
    OUT="$OUT" scripts/variants.sh build
    for tree in "$v128" "$v129"; do
      echo "tests $tree: $(cd "/tmp/variants/$tree" && python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_cuda.py -k "mid_vector or flat or learnable or repeated" 2>&1 | tail -n 1)"
    done
    NAMES="$v128 $v129" OUT="$OUT" scripts/variants.sh memcheck ;;
  measure)
    # 64x16x197x197: every batch starts a whole number of vectors into x, so its bias lies as x does in main's
    # layout (v128 takes it); at 12 heads only v129's copy makes it so. 8x20x1500x1500: six vectors a thread.
    NAMES="main $v128 $v129" ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
      --grid 64x12x197x197,64x16x197x197,8x20x1500x1500,1024x4x49x49 --dtypes bfloat16,float16 --passes fwd \
      --variants none,additive,key_padding,bias
    for tree in main "$v128" "$v129"; do
      for shape in 64x12x197x197 64x16x197x197; do
        echo "learnable $tree $shape:"
        PYTHONPATH="/tmp/variants/$tree" python3 benchmarks/learnable_bias.py --shape "$shape" --kernels 2>&1 |
          tail -n 4
      done
    done ;;
esac
