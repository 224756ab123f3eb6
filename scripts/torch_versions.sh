#!/usr/bin/env bash
# The whole test suite against other releases of torch, the CPU kernels built: each release in a virtual
# environment and a copy of this tree of its own, under $WORK (default /tmp/scaled_mask_softmax-torch-versions).
#   ./scripts/torch_versions.sh [PYTHON:TORCH_VERSION ...]
# Default: the oldest torch (with the oldest Python) this package takes, and the first releases after each of its
# version gates (scaled_mask_softmax/ops.py, _transforms.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-/tmp/scaled_mask_softmax-torch-versions}"
if [ $# -eq 0 ]; then
  set -- "${PYTHON39:-python3.9}:2.4.1" "python3:2.5.1" "python3:2.6.0"
fi
status=0
for pair in "$@"; do
  python="${pair%%:*}" version="${pair##*:}"
  venv="$work/venv-$version" tree="$work/tree-$version"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet "torch==$version" ninja numpy pytest hypothesis setuptools wheel
  rm -rf "$tree" && mkdir -p "$tree"
  (cd "$root" && git ls-files -co --exclude-standard | tar -cf - -T -) | (cd "$tree" && tar -xf -)
  summary=$(cd "$tree" &&
            SCALED_MASK_SOFTMAX_CPU_ONLY=1 "$venv/bin/python" -m pip install --quiet --no-build-isolation --no-deps \
              --editable . >"$venv/build.log" 2>&1 &&
            "$venv/bin/python" -m pytest -q -p no:cacheprovider 2>&1 | tail -n 1) || status=1
  echo "torch $version, $("$venv/bin/python" --version): ${summary:-build failed, see $venv/build.log}"
  case "$summary" in *failed*|*error*|"") status=1 ;; esac
done
exit $status
