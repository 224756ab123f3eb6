#!/usr/bin/env bash
# v132, v133 and v134 against main on the GPU machine (benchmarks/NOTES.md, "v132", "v133" and "v134"), in three
# calls (on an H100, 2026-12-06: build and tests 600 s with memcheck cut short, measure 40 s a round, grid 60 s).
# v134's patch holds all three commits on main, v135's all four (TREE=v135-shifted-causal-two-pass). Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v134-shifted-forward-in-cluster.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v132-v134.sh build, then ... measure, then
# ... grid. Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
tree="${TREE:-v134-shifted-forward-in-cluster}"
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
case "${1:?build, measure or grid}" in
  build)
    OUT="$OUT" scripts/variants.sh build
    echo "tests $tree: $(cd "/tmp/variants/$tree" && python3 -m pytest -q -p no:cacheprovider -m gpu \
      tests/test_cuda.py -k "narrowed or unaligned or see or mid_vector or nan or long" 2>&1 | tail -n 1)"
    NAMES="$tree" OUT="$OUT" scripts/variants.sh memcheck ;;
  measure)
    # Causal cells: v132's; backwards without a causal limit past a block's registers: v133's; forwards: v134's.
    ROUNDS="${ROUNDS:-1}" OUT="$OUT" scripts/variants.sh sweep \
      --grid 1x16x1024x9001,4x16x512x10007,1x16x1024x20001,1x4x512x65539,8x4x1000x2051 --dtypes bfloat16,float32 \
      --variants none,causal,key_padding,additive,bias --passes fwd,bwd ;;
  grid)
    # The grid's cells that v132's zeros (narrowed causal rows) and the cluster kernels' new parameters touch.
    ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep --grid 1x1x4096x65536,1x1x1024x262144,8x32x1024x1024 \
      --dtypes bfloat16 --variants none,causal,key_padding,additive,bias --passes fwd,bwd
    # Causal rows that start mid-vector and are not narrowed (as many queries as keys), which none of the three
    # changes: fp32 past 8192 columns takes two passes at VEC 1; a figure for what comes next.
    ROUNDS=1 OUT="$OUT" scripts/variants.sh sweep --grid 1x4x9001x9001 --dtypes bfloat16,float32 --variants causal \
      --passes fwd,bwd ;;
esac
