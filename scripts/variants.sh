#!/usr/bin/env bash
# Several builds compared on one GPU machine in one call, since the machine keeps nothing between calls:
#   scripts/variants.sh pack main v8 ...   here: the sources of each git ref, to .variants/<ref>.tar
#   scripts/variants.sh run [sweep args]   there: builds them side by side, checks each against the float64
#                                          reference (check --quick), then sweeps them in turns, twice
# Logs, sweep.jsonl and the table (benchmarks/sweep.py --table) go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
action="${1:-}"
shift || true
case "$action" in
  pack)
    rm -rf .variants && mkdir -p .variants
    for ref in "$@"; do git archive --format=tar -o ".variants/${ref//\//-}.tar" "$ref" || exit 1; done ;;
  run)
    OUT="${OUT:-gpu-logs}"
    mkdir -p "$OUT"
    names=()
    for tar in .variants/*.tar; do names+=("$(basename "$tar" .tar)"); done
    jobs=$(( $(nproc) / ${#names[@]} > 0 ? $(nproc) / ${#names[@]} : 1 ))
    for name in "${names[@]}"; do
      tree="/tmp/variants/$name"
      rm -rf "$tree" && mkdir -p "$tree" && tar -xf ".variants/$name.tar" -C "$tree"
      (cd "$tree" && MAX_JOBS=$jobs python3 setup.py build_ext --inplace >"$OUT/build-$name.log" 2>&1
       echo "build $name: exit $?") &
    done
    wait
    for name in "${names[@]}"; do
      (cd "/tmp/variants/$name" && python3 -m scaled_mask_softmax check --device cuda --quick) \
        >"$OUT/check-$name.log" 2>&1
      echo "check $name: exit $? | $(tail -n 1 "$OUT/check-$name.log")"
    done
    for round in 1 2; do
      for name in "${names[@]}"; do
        PYTHONPATH="/tmp/variants/$name" python3 benchmarks/sweep.py --tag "$name" --out "$OUT/sweep.jsonl" "$@" \
          >>"$OUT/sweep-$name.log" 2>&1 || echo "sweep $name (round $round): failed"
      done
    done
    python3 benchmarks/sweep.py --table "$OUT/sweep.jsonl" | tee "$OUT/table.txt" ;;
  *)
    echo "usage: scripts/variants.sh pack REF... | run [benchmarks/sweep.py arguments]" >&2
    exit 2 ;;
esac
