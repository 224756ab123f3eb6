#!/usr/bin/env bash
# SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS on a GPU (benchmarks/NOTES.md, "synccheck"): the probe under synccheck, the
# sanitizer over every case (synccheck with the knob), the knob's tests, and what it costs. Here first:
#   scripts/variants.sh pack main && PREBUILD_PYTHON=/tmp/device-torch/bin/python scripts/variants.sh prebuild
# There (carry [".variants"]), about 300 s:
#   OUT=$OUT bash benchmarks/prepared/portable-clusters.sh
source "$(dirname "$0")/compare.sh"
OUT="$OUT" scripts/gpu_suite.sh prebuilt || OUT="$OUT" scripts/gpu_suite.sh build
nvcc -std=c++17 -arch=sm_90 -o /tmp/synccheck benchmarks/probes/synccheck.cu
compute-sanitizer --version | tail -n 1
for clusters in "16 640" "12 624" "9 630" "8 640" "16 16"; do
  # shellcheck disable=SC2086
  compute-sanitizer --tool synccheck /tmp/synccheck $clusters | grep clusters
done
/tmp/synccheck 16 640
OUT="$OUT" scripts/gpu_suite.sh sanitize
python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k portable tests/test_doctor.py 2>&1 | tail -n 2
for portable in 0 1; do
  echo "SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=$portable"
  SCALED_MASK_SOFTMAX_PORTABLE_CLUSTERS=$portable python3 -m scaled_mask_softmax bench --no-compile \
    --grid 1x1x1024x262144,1x2x256x131077,1x2x256x150001 --dtypes bfloat16 --variants none,additive,key_padding \
    --passes fwd,bwd
done
