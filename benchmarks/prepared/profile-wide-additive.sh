#!/usr/bin/env bash
# The forward's wide register kernels with an additive mask profiled in two cells of one geometry (16,386 vectors of
# 16 bytes a row, of x and of mask; both over 8 blocks on main) that measured far apart: bf16 1x2x256x131077 1.51 of
# the floor, fp32 1x4x512x65539 0.99 (benchmarks/NOTES.md, v148). Nsight Compute's sections for one launch of each,
# to $OUT/bf16/profile.txt and $OUT/fp32/profile.txt. About 300 s on a fresh machine. There: OUT=$OUT bash <this>
set -uo pipefail
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" scripts/gpu_suite.sh build || exit 1
OUT="$OUT/bf16" scripts/profile.sh --grid 1x2x256x131077 --dtypes bfloat16 --variants additive --passes fwd
OUT="$OUT/fp32" scripts/profile.sh --grid 1x4x512x65539 --dtypes float32 --variants additive --passes fwd
