#!/usr/bin/env bash
# v142, v143, v144 and v145 in one tree against main (benchmarks/NOTES.md, "v142" to "v145";
# benchmarks/prepared/v142-v145-together.patch: their four commits on main, v143's joins to v142's by hand), for a
# lease too short for v142-v145.sh's four builds. Their cells are apart: v142 key padding of rows that start
# mid-vector within a cluster's registers, v143 such rows past them, v144 the staged forwards' block counts (rows
# without a mask whose vectors are no power of two), v145 the backwards and the forwards of a full mask there.
# Two calls on an H100: `build measure` (about 450 s; ROUNDS=1 about 350), then `test` (about 250 s). Packed here
# first:
#   scripts/variants.sh pack main benchmarks/prepared/v142-v145-together.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v142-v145-together.sh build measure, then
# ... test. Its own lines go to $OUT/run.txt as well: variants.sh packs $OUT's *.log files away between its actions.
set -uo pipefail
cd "$(dirname "$0")/../.."
together=v142-v145-together
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
sweep() {
  ROUNDS="${ROUNDS:-2}" OUT="$OUT" scripts/variants.sh sweep "$@"
}
for action in "${@:?build, measure or test}"; do
  case "$action" in
    build)
      OUT="$OUT" scripts/variants.sh build ;;
    measure)
      # v142 (key padding), v144 (without a mask: fewer staged blocks at 65,539 and 131,077); aligned 65,536 beside.
      sweep --grid 1x16x1024x20001,1x4x512x65539,1x4x512x65536,1x2x256x131077 --dtypes bfloat16,float32 \
        --variants none,key_padding --passes fwd
      # v143: past a cluster's registers, two passes in vectors where main went element by element.
      sweep --grid 1x1x512x262147,1x1x512x262144 --dtypes bfloat16 --variants none,key_padding,additive --passes fwd
      sweep --grid 1x2x256x131077 --dtypes float32 --variants additive --passes fwd
      # v144: fewest staged blocks no power of two (3 at 90,000 bf16 and 40,001 fp32, 7 at 100,000 fp32).
      sweep --grid 1x4x512x90000,1x4x512x40001,1x2x256x100000 --dtypes bfloat16,float32 \
        --variants none,key_padding,bias --passes fwd
      # v145: wide rows in 5-7 blocks where main took 8 (aligned 131,072 fp32 in 8 in both).
      sweep --grid 1x4x512x65539,1x2x256x100000,1x2x256x131072 --dtypes float32 --variants none,bias --passes bwd
      sweep --grid 1x2x256x131077,1x2x256x131080 --dtypes bfloat16 --variants none,bias --passes bwd
      sweep --grid 1x4x512x65539,1x2x256x131077 --dtypes float32,bfloat16 --variants additive --passes fwd ;;
    test)
      # Every line to $OUT (a call cut short still brings back how far the tests got).
      (cd "/tmp/variants/$together" && timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
         -k "very_long or long_rows or cluster or one_stage or mid_vector" >"$OUT/tests-$together.txt" 2>&1
       tail -n 3 "$OUT/tests-$together.txt")
      NAMES="$together" OUT="$OUT" scripts/variants.sh memcheck ;;
    *) echo "unknown action $action" >&2; exit 2 ;;
  esac
done
