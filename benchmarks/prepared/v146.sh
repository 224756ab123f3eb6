#!/usr/bin/env bash
# v146 on the GPU machine (benchmarks/NOTES.md, "Version 70" and "v146"): one build of main with the knob
# SMS_SHORT_CAUSAL_VECTORS, the causal backward of short rows swept under several of its values, in one call of about
# 300 s. Packed here first (the only build in .variants):
#   scripts/variants.sh pack benchmarks/prepared/v146-short-causal-vectors-knob.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v146.sh
# 16 is main's plan (two vectors a thread in causal rows of at most 16 vectors, v108), 0 version 69's (four), 8 and 13
# between: bf16 rows of 49, 64, 97 and 128 columns span 7, 8, 13 and 16 vectors, fp32 rows of 49 and 64 span 13 and 16.
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" scripts/variants.sh build
CONFIGS="v69:SMS_SHORT_CAUSAL_VECTORS=0 to8:SMS_SHORT_CAUSAL_VECTORS=8 to13:SMS_SHORT_CAUSAL_VECTORS=13" \
  ROUNDS=2 OUT="$OUT" scripts/variants.sh sweep \
  --grid 256x16x128x128,512x8x97x97,2048x4x64x64,1024x4x49x49 --dtypes bfloat16,float16,float32 --variants causal \
  --passes bwd
