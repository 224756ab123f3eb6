#!/usr/bin/env bash
# v142 against main on the GPU machine (benchmarks/NOTES.md, "v142"; a patch on main), in one call of about 450 s on
# an H100 (build about 250 s, test 80, measure 120), or one call an action. Packed here first:
#   scripts/variants.sh pack main benchmarks/prepared/v142-shifted-key-padding-staged-in-cluster.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v142.sh build test measure. Its own lines go
# to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
v142=v142-shifted-key-padding-staged-in-cluster
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
for action in "${@:?build, test or measure}"; do
  case "$action" in
    build)
      OUT="$OUT" scripts/variants.sh build ;;
    test)
      echo "tests $v142: $(cd "/tmp/variants/$v142" && timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_cuda.py -k "mid_vector and not causal" 2>&1 | tail -n 1)"
      NAMES="$v142" OUT="$OUT" scripts/variants.sh memcheck ;;
    measure)
      # Rows that start mid-vector past a block's registers, without a causal limit: with a bool key mask read
      # from global memory beside x staged over a cluster's blocks (v142) or held in their registers (main);
      # without a mask, the same in both (staged, v139). The aligned rows of 65,536 columns for the floor's reach.
      ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
        --grid 1x16x1024x20001,1x4x512x65539,1x4x512x65536,1x2x256x131077 --dtypes bfloat16,float32 \
        --variants none,key_padding --passes fwd ;;
    *) echo "unknown action $action" >&2; exit 2 ;;
  esac
done
