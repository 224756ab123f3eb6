# Sourced by the comparisons of builds on one machine (v149-h200.sh, v150.sh, v151-v152.sh, v153.sh): from the
# repository root, all they print also to $OUT/run.txt, the card's name first.
#   build_then_test NAME EXPRESSION   every packed build built where it is not yet, then NAME's GPU tests that
#                                     pytest's -k EXPRESSION selects
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec > >(tee -a "$OUT/run.txt") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1

build_then_test() {
  OUT="$OUT" scripts/variants.sh ensure
  NAMES="$1" OUT="$OUT" scripts/variants.sh test tests/test_cuda.py -m gpu -k "$2"
}
