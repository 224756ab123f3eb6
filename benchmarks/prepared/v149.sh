#!/usr/bin/env bash
# v149 on the GPU machine (benchmarks/NOTES.md, "v149"): this tree built and installed, its cluster and mid-vector GPU
# tests, then the staged forward's cells that the busiest block count moves (and some it leaves as they were), two
# rounds. About 330 s on a fresh machine. There: OUT=$OUT bash benchmarks/prepared/v149.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" GPU_TESTS=tests/test_cuda.py GPU_TESTS_K="cluster or mid_vector or staged or very_long" \
  scripts/gpu_suite.sh build gpu-tests || exit 1
sweep() { python3 benchmarks/sweep.py --tag v149 --out "$OUT/sweep.jsonl" --passes fwd "$@" >/dev/null; }
for round in 1 2; do
  # Moved: bf16 65,539 4 -> 3 blocks, 131,077 8 -> 5, 200,000 and 100,000 8 and 4 -> 7; fp32 100,000 8 -> 7.
  # As they were: bf16 80,000 and 90,000 (4), fp32 110,000 and 90,000 (8).
  sweep --grid 1x4x512x65539,1x2x256x131077,1x2x256x80000 --dtypes bfloat16 --variants none
  sweep --grid 1x2x256x200000,1x2x256x100000,1x4x512x90000 --dtypes bfloat16 --variants none,key_padding,bias
  sweep --grid 1x2x256x100000 --dtypes float32 --variants none,key_padding,bias
  sweep --grid 1x2x256x110000,1x4x512x90000 --dtypes float32 --variants none
done
python3 benchmarks/sweep.py --table "$OUT/sweep.jsonl" | tee "$OUT/table.txt"
