#!/usr/bin/env bash
# Creates .venv with torch and the test tools, then builds and installs this package into it (editable).
# The CUDA kernels are built when torch is a CUDA build and nvcc is found (see setup.py for the knobs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade "$TORCH_SPEC" ninja numpy pytest hypothesis matplotlib \
  transformers==5.17.0
if ! .venv/bin/python -m pip install --verbose --no-build-isolation --no-deps --editable . >.venv/build.log 2>&1; then
  tail -n 60 .venv/build.log
  exit 1
fi
# What was compiled, and by which compiler (full log: .venv/build.log).
grep -E "scaled_mask_softmax:|^ *\[[0-9]+/[0-9]+\]" .venv/build.log | cut -c1-220
.venv/bin/python -c "import scaled_mask_softmax"
