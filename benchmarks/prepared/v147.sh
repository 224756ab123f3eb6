#!/usr/bin/env bash
# v147 on the GPU machine (benchmarks/NOTES.md, "v147"): v142-v145 together in one build, each of them turned off
# by SMS_V142 ... SMS_V145=0, swept apart (each alone on main's plan: "only142" ...), together (the build's own rows)
# and all off ("none": main's plan), in one call of about 520 s on an H100 (the build's 260 s skipped where v148.sh
# left it on a warm machine). v145 is the forward's half only (main took its backward half); the backward sweeps time
# main's landed form. Packed here first (the only build in .variants):
#   scripts/variants.sh pack benchmarks/prepared/v147-v148-knobs.patch
# then, there (carry [".variants"]): OUT=$OUT bash benchmarks/prepared/v147.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1
OUT="$OUT" scripts/variants.sh ensure
none="none:SMS_V142=0,SMS_V143=0,SMS_V144=0,SMS_V145=0"
only142="only142:SMS_V143=0,SMS_V144=0,SMS_V145=0"
only144="only144:SMS_V142=0,SMS_V143=0,SMS_V145=0"
only145="only145:SMS_V142=0,SMS_V143=0,SMS_V144=0"
sweep() {
  local configs="$1"
  shift
  CONFIGS="$configs" ROUNDS="${ROUNDS:-2}" OUT="$OUT" scripts/variants.sh sweep "$@"
}
# Within a cluster's registers: v142 (key padding of rows that start mid-vector), v144 (the staged forward's block
# count), v145 (the wide register kernels' count: forward_in_cluster's wide rows where nothing is staged).
sweep "$none $only142 $only144 $only145" --grid 1x16x1024x20001,1x4x512x65539,1x2x256x131077 \
  --dtypes bfloat16,float32 --variants none,key_padding --passes fwd
sweep "$none $only142 $only144 $only145" --grid 1x4x512x90000,1x4x512x40001,1x2x256x100000 \
  --dtypes bfloat16,float32 --variants none,key_padding,bias --passes fwd
sweep "$none $only144 $only145" --grid 1x4x512x65539,1x2x256x131077 --dtypes float32,bfloat16 --variants additive \
  --passes fwd
# Past a cluster's registers only v143 acts (262,144: a row of whole vectors, which nothing here changes); the
# backward is main's whatever the settings.
sweep "$none" --grid 1x1x512x262147,1x1x512x262144 --dtypes bfloat16 --variants none,key_padding,additive --passes fwd
sweep "$none" --grid 1x2x256x131077 --dtypes float32 --variants additive --passes fwd
sweep "" --grid 1x4x512x65539,1x2x256x100000 --dtypes float32 --variants none,bias --passes bwd
sweep "" --grid 1x2x256x131077,1x2x256x131080 --dtypes bfloat16 --variants none,bias --passes bwd
