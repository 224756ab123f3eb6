#!/usr/bin/env bash
# v123 and v124 against main in one call on the GPU machine (benchmarks/NOTES.md, "v123" and "v124"), about 420 s.
# Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v123-flat-bias-grad.patch \
#     benchmarks/prepared/v124-flat-forward-with-following-masks.patch
# then, there: OUT=$OUT bash benchmarks/prepared/v123-v124.sh (with carry [".variants"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
trees=(main v123-flat-bias-grad v124-flat-forward-with-following-masks)
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" scripts/variants.sh build
for tree in "${trees[@]}"; do
  echo "tests $tree: $(cd "/tmp/variants/$tree" && python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
    -k "flat or mid_vector or learnable" 2>&1 | tail -n 1)"
done
for tree in main v123-flat-bias-grad; do
  echo "learnable $tree:"
  PYTHONPATH="/tmp/variants/$tree" python3 benchmarks/learnable_bias.py --shape 1024x4x49x49 2>&1 | tail -n 5
done
ROUNDS=1 OUT="$OUT" scripts/variants.sh sweep --grid 1024x4x49x49,64x12x77x77 --dtypes bfloat16,float32 \
  --passes fwd,bwd
NAMES="v123-flat-bias-grad v124-flat-forward-with-following-masks" OUT="$OUT" scripts/variants.sh memcheck
