#!/usr/bin/env bash
# Nsight Compute on our kernels, the clocks left alone: benchmarks/sweep.py runs the cells its arguments choose,
# and one launch of a forward or backward kernel past the warm-up is profiled. The report goes to $OUT/profile.txt:
#   scripts/profile.sh --min-cols 1024 --max-cols 1024 --dtypes bfloat16 --variants causal --passes fwd
# SKIP (default 3) sets how many of our launches pass first (under ncu, a sweep of long rows launches few);
# NCU_ARGS adds arguments of ncu's own, such as
#   NCU_ARGS='--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-logs}"
mkdir -p "$OUT"
ncu --clock-control none --kernel-name-base demangled \
    --kernel-name regex:'(forward|backward)_(in_registers|in_cluster|two_pass|staged)' \
    --launch-skip "${SKIP:-3}" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section InstructionStats ${NCU_ARGS:-} \
    python3 benchmarks/sweep.py --tag profile "$@" >"$OUT/profile.txt" 2>&1
echo "profile: exit $? | $(grep -m1 -E '^ +Duration' "$OUT/profile.txt")"
