#!/usr/bin/env bash
# Nsight Compute on our kernels, the clocks left alone: benchmarks/sweep.py runs the cells its arguments choose,
# and one launch of a forward or backward kernel past the warm-up is profiled. The report goes to $OUT/profile.txt:
#   scripts/profile.sh --min-cols 1024 --max-cols 1024 --dtypes bfloat16 --variants causal --passes fwd
# SKIP (default 3) sets how many of our launches pass first (under ncu, a sweep of long rows launches few);
# NCU_ARGS adds arguments of ncu's own, such as
#   NCU_ARGS='--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
# SOURCE=1 profiles the full set instead and exports each SASS instruction's executed count and stall samples to
# $OUT/source.csv.gz, summarized in $OUT/source.txt (benchmarks/source_profile.py); the report itself, too large to
# bring back from a lent machine, is removed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-logs}"
mkdir -p "$OUT"
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats
          --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats)
[ "${SOURCE:-0}" = 1 ] && sections=(--set full --import-source no -f -o "$OUT/profile")
ncu --clock-control none --kernel-name-base demangled \
    --kernel-name regex:'(forward|backward)_(in_registers|in_cluster|two_pass|staged)' \
    --launch-skip "${SKIP:-3}" --launch-count 1 "${sections[@]}" ${NCU_ARGS:-} \
    python3 benchmarks/sweep.py --tag profile "$@" >"$OUT/profile.txt" 2>&1
code=$?
if [ "${SOURCE:-0}" = 1 ]; then
  ncu -i "$OUT/profile.ncu-rep" --page details >>"$OUT/profile.txt" 2>&1
  ncu -i "$OUT/profile.ncu-rep" --page source --csv --print-source sass | gzip >"$OUT/source.csv.gz"
  python3 benchmarks/source_profile.py "$OUT/source.csv.gz" >"$OUT/source.txt" 2>&1
  echo "source: exit $? | $(head -n 2 "$OUT/source.txt" | tail -n 1)"
  rm -f "$OUT/profile.ncu-rep"
fi
echo "profile: exit $code | $(grep -m1 -E '^ +Duration' "$OUT/profile.txt")"
