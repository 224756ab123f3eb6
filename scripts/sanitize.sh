#!/usr/bin/env bash
# compute-sanitizer over every kernel variant (scripts/sanitizer_cases.py): memcheck, racecheck, initcheck and
# synccheck, one line of error counts each. Run on a GPU machine after `pip install --no-build-isolation -e .` or
# `python setup.py build_ext --inplace`: the cases import this tree's package either way.
# The tools' full reports go to one log, $OUT/sanitizer.log (default OUT: sanitizer-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-sanitizer-logs}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Each tensor gets its own allocation, so an access past its end is outside any allocation and is reported.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
status=0
log="$OUT/sanitizer.log"
: >"$log"
for tool in memcheck racecheck initcheck synccheck; do
  echo "=== $tool" >>"$log"
  # racecheck looks at our kernels only (names in namespace sms): it reports hazards in torch's own reduction that
  # the reference's all() over rows of 262,144 columns runs. The other tools see every kernel, as initcheck must
  # to know which memory torch's kernels wrote.
  filter=()
  [ "$tool" = racecheck ] && filter=(--kernel-name kns=sms)
  # synccheck stops with an illegal address, reporting nothing, in kernels that initialise an mbarrier in clusters of
  # more than 8 blocks (ours are sound there: benchmarks/NOTES.md, "synccheck"), so it sees them in clusters of 8.
  settings=()
  [ "$tool" = synccheck ] && settings=(SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=1)
  env "${settings[@]}" compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 3 \
    python3 scripts/sanitizer_cases.py >>"$log" 2>&1
  code=$?
  echo "$tool: exit $code, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)"
  [ "$code" -eq 0 ] || status=1
done
exit $status
