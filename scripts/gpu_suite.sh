#!/usr/bin/env bash
# Everything that needs a GPU, in one call: build in place, the whole test suite (GPU tests included), check,
# doctor, compute-sanitizer and the benchmark. Pick stages as arguments (default: all but sanitize and bench):
#   scripts/gpu_suite.sh build tests check doctor sanitize bench fuzz unaligned learnable
# prebuilt, in place of build: the libraries that `scripts/variants.sh prebuild` compiled elsewhere for the packed
# build PREBUILT (default main; carry [".variants"]), unpacked into this tree where they were built against this torch.
# unaligned: rows that start mid-vector (benchmarks/unaligned.py), and the same shapes against the peers.
# learnable: forward+backward with a learnable fp32 bias against the peers (benchmarks/learnable_bias.py), at the
# shapes LEARNABLE_SHAPES names (comma-separated), with the GPU's busy time a step beside the wall time (--kernels).
# gpu-tests runs only the tests marked gpu (CI runs the others on every commit), in the files GPU_TESTS names
# (default: all, about 300 s on an H100 once built; where a call has less left, split them:
# GPU_TESTS=tests/test_contract.py, then the rest), and only those GPU_TESTS_K selects, if set (pytest's -k:
# GPU_TESTS_K="staged or cluster").
# Logs and results go to $OUT (default gpu-logs); the last line of each stage is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-logs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}" NCCL_NVLS_ENABLE=0
# The scripts of benchmarks/ import this tree's package, installed or not (Python puts a script's folder first).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
UNALIGNED_GRID="${UNALIGNED_GRID:-64x12x197x197,1024x4x49x49,8x32x1023x1023,8x20x1500x1500}"
LEARNABLE_SHAPES="${LEARNABLE_SHAPES:-$UNALIGNED_GRID,8x32x1024x1024,2x16x1024x16384}"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build tests check doctor)
status=0
for stage in "${stages[@]}"; do
  case "$stage" in
    build) python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1 ;;
    prebuilt) { tar -xJf ".variants/${PREBUILT:-main}.libs.tar.xz" &&
                python3 scripts/built_for_this_torch.py scaled_mask_softmax/_build_info.json &&
                echo "prebuilt ${PREBUILT:-main}"; } >"$OUT/prebuilt.log" 2>&1 ;;
    tests) python3 -m pytest -q -s -p no:cacheprovider --durations=25 >"$OUT/tests.log" 2>&1 ;;
    gpu-tests) python3 -m pytest -q -s -p no:cacheprovider --durations=25 -m gpu ${GPU_TESTS:-} \
                 ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} >"$OUT/gpu-tests.log" 2>&1 ;;
    fuzz) SCALED_MASK_SOFTMAX_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-2000}" \
            python3 -m pytest -q -p no:cacheprovider tests/test_properties.py >"$OUT/fuzz.log" 2>&1 ;;
    check) python3 -m scaled_mask_softmax check >"$OUT/check.log" 2>&1 ;;
    doctor) python3 -m scaled_mask_softmax doctor >"$OUT/doctor.log" 2>&1 ;;
    sanitize) OUT="$OUT" scripts/sanitize.sh >"$OUT/sanitize.log" 2>&1 ;;
    bench) python3 benchmarks/bench.py --e2e >"$OUT/bench.log" 2>&1 && cp benchmarks/results/* "$OUT/" ;;
    unaligned) { python3 benchmarks/unaligned.py --grid "$UNALIGNED_GRID" &&
                 python3 -m scaled_mask_softmax bench --grid "$UNALIGNED_GRID" --dtypes bfloat16 \
                   --json "$OUT/unaligned.json"; } >"$OUT/unaligned.log" 2>&1 ;;
    learnable) (for shape in ${LEARNABLE_SHAPES//,/ }; do
                  python3 benchmarks/learnable_bias.py --shape "$shape" --kernels || exit 1
                done) >"$OUT/learnable.log" 2>&1 ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
  esac
  code=$?
  echo "$stage: exit $code | $(tail -n 1 "$OUT/$stage.log" 2>/dev/null)"
  [ "$code" -eq 0 ] || status=1
done
exit $status
