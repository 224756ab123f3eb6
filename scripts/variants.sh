#!/usr/bin/env bash
# Several builds compared on one GPU machine:
#   scripts/variants.sh pack main v8 ...    here: the sources of each git ref, to .variants/<ref>.tar (in place of
#                                           every build packed before: a prebuilt one too); a .patch
#                                           file (benchmarks/prepared/) is applied to HEAD, to .variants/<name>.tar,
#                                           as are several joined by + (a.patch+b.patch), in turn, to <a>+<b>.tar
#   scripts/variants.sh prebuild            here: compiles each packed build's libraries against the GPU machine's
#                                           torch (PREBUILD_PYTHON, below), to .variants/<name>.libs.tar.xz
#   scripts/variants.sh build               there: builds them side by side in /tmp/variants (or takes their
#                                           prebuilt libraries), checks each against the float64 reference
#                                           (check --quick)
#   scripts/variants.sh ensure              there: builds (as build) only those with no built library in /tmp/variants
#   scripts/variants.sh sweep [sweep args]  there: sweeps the builds in turns, ROUNDS times (default 2), each also
#                                           under the settings in CONFIGS (below)
#   scripts/variants.sh run [sweep args]    build, then sweep
#   scripts/variants.sh test [pytest args]  there: the test suite of each build, in its own tree (default: all)
#   scripts/variants.sh memcheck            there: compute-sanitizer memcheck over each build's sanitizer cases
# A machine kept warm between calls keeps /tmp/variants, so one call may build and the next sweep.
# NAMES="main v8" limits build, sweep and test to those builds (default: every one packed).
# The builds are in place, not installed: a script of benchmarks/ run by hand in a build's tree needs
# PYTHONPATH=/tmp/variants/<name> (Python puts the script's folder first, not the working directory).
# sweep.jsonl, the table (benchmarks/sweep.py --table) and logs-<action>.tgz go to $OUT.
# PREBUILD_PYTHON: a Python here whose torch is the GPU machine's (2.11.0+cu130 there:
# python3 -m venv /tmp/device-torch && /tmp/device-torch/bin/pip install torch==2.11.0), so that the machine's
# time goes to measuring, not to building (about 400 s for two builds). prebuild's TORCH_CUDA_ARCH_LIST: default 9.0.
set -uo pipefail
cd "$(dirname "$0")/.."
action="${1:-}"
shift || true
names=()
for tar in .variants/*.tar; do [ -e "$tar" ] && names+=("$(basename "$tar" .tar)"); done
[ -z "${NAMES:-}" ] || read -r -a names <<<"$NAMES"

build() {
  local jobs=$(( $(nproc) / ${#names[@]} > 0 ? $(nproc) / ${#names[@]} : 1 ))
  for name in "${names[@]}"; do
    local tree="/tmp/variants/$name"
    rm -rf "$tree" && mkdir -p "$tree" && tar -xf ".variants/$name.tar" -C "$tree"
    # Every build timed by this checkout's harness: sweep.py calls into the bench module of the build it imports.
    cp scaled_mask_softmax/bench.py "$tree/scaled_mask_softmax/bench.py"
    if use_prebuilt "$name"; then echo "build $name: prebuilt"; continue; fi
    (cd "$tree" && MAX_JOBS=$jobs python3 setup.py build_ext --inplace >"$OUT/build-$name.log" 2>&1
     echo "build $name: exit $?") &
  done
  wait
  for name in "${names[@]}"; do
    (cd "/tmp/variants/$name" && python3 -m scaled_mask_softmax check --device cuda --quick) \
      >"$OUT/check-$name.log" 2>&1
    echo "check $name: exit $? | $(tail -n 1 "$OUT/check-$name.log")"
  done
}

# The libraries prebuild compiled for $1, where they were built against this machine's torch.
use_prebuilt() {
  local tree="/tmp/variants/$1" libs=".variants/$1.libs.tar.xz"
  [ -e "$libs" ] && tar -xJf "$libs" -C "$tree" || return 1
  python3 scripts/built_for_this_torch.py "$tree/scaled_mask_softmax/_build_info.json" 2>&1 && return 0
  echo "$1: building"
  rm -f "$tree"/scaled_mask_softmax/_C*.so "$tree/scaled_mask_softmax/_build_info.json"
  return 1
}

# Here: each build's libraries, named for no one Python (their modules call only the stable PyModule_Create2, so
# what Python 3.11 built here loads in the machine's 3.12), with the record of what they were built against.
prebuild() {
  local python="${PREBUILD_PYTHON:?a Python with the torch of the GPU machine}" tree
  for name in "${names[@]}"; do
    tree="$(mktemp -d)" && tar -xf ".variants/$name.tar" -C "$tree"
    (cd "$tree" && CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
       "$python" setup.py build_ext --inplace) >".variants/$name.prebuild.log" 2>&1 &&
      (cd "$tree/scaled_mask_softmax" && for lib in _C*.so; do mv "$lib" "${lib%%.*}.so"; done) &&
      tar -cJf ".variants/$name.libs.tar.xz" -C "$tree" scaled_mask_softmax/_C.so scaled_mask_softmax/_C_cuda.so \
        scaled_mask_softmax/_build_info.json
    local code=$?
    rm -rf "$tree"
    echo "prebuild $name: exit $code"
    [ "$code" -eq 0 ] || return 1
  done
}

# The packed builds that a machine kept warm has not built yet (or whose build was cut off).
unbuilt() {
  for name in "${names[@]}"; do
    compgen -G "/tmp/variants/$name/scaled_mask_softmax/_C_cuda*.so" >/dev/null || echo "$name"
  done
}

# CONFIGS: settings each build is swept under besides its own, "tag:VAR=value,VAR=value" separated by spaces (the
# environment knobs of an experiment's build, such as benchmarks/prepared/v44-cluster-knobs.patch's); a setting's
# rows are tagged <build>-<tag>.
sweep() {
  for round in $(seq "${ROUNDS:-2}"); do
    for name in "${names[@]}"; do
      for config in "" ${CONFIGS:-}; do
        local tag="$name" settings=()
        if [ -n "$config" ]; then
          tag="$name-${config%%:*}"
          IFS=, read -r -a settings <<<"${config#*:}"
        fi
        env "${settings[@]}" PYTHONPATH="/tmp/variants/$name" python3 benchmarks/sweep.py --tag "$tag" \
          --out "$OUT/sweep.jsonl" "$@" >>"$OUT/sweep-$tag.log" 2>&1 || echo "sweep $tag (round $round): failed"
      done
    done
  done
  PYTHONPATH="/tmp/variants/${names[0]}" python3 benchmarks/sweep.py --table "$OUT/sweep.jsonl" | tee "$OUT/table.txt"
}

run_tests() {
  for name in "${names[@]}"; do
    (cd "/tmp/variants/$name" && python3 -m pytest -q -p no:cacheprovider "${@:-tests}") >"$OUT/test-$name.log" 2>&1
    echo "test $name: exit $? | $(tail -n 1 "$OUT/test-$name.log")"
  done
}

# memcheck with the caching allocator off, so that each tensor is an allocation of its own and a read past an
# operand's end shows.
run_memcheck() {
  for name in "${names[@]}"; do
    (cd "/tmp/variants/$name" && PYTHONPATH="$PWD" PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
       --error-exitcode 3 python3 scripts/sanitizer_cases.py) >"$OUT/memcheck-$name.log" 2>&1
    echo "memcheck $name: exit $? | $(tail -n 1 "$OUT/memcheck-$name.log")"
  done
}

# The machine sends back only a few files: the logs travel as one archive, named for the action.
pack_logs() {
  (cd "$OUT" && tar -czf "logs-$action.tgz" ./*.log && rm -f ./*.log)
}

# HEAD with each patch applied in turn, to .variants/<their names joined by +>.tar.
pack_patched() {
  local tree name="" patch code=0
  tree="$(mktemp -d)"
  git worktree add -q --detach "$tree" HEAD || return 1
  for patch in "$@"; do
    name="${name:+$name+}$(basename "$patch" .patch)"
    git -C "$tree" am -q "$(realpath "$patch")" || { code=1; break; }
  done
  [ "$code" -ne 0 ] || git -C "$tree" archive --format=tar -o "$PWD/.variants/$name.tar" HEAD || code=1
  git worktree remove --force "$tree"
  return "$code"
}

if [ "$action" != pack ] && [ "$action" != prebuild ]; then
  mkdir -p "${OUT:-gpu-logs}"
  OUT="$(cd "${OUT:-gpu-logs}" && pwd)"
fi
case "$action" in
  pack)
    rm -rf .variants && mkdir -p .variants
    for ref in "$@"; do
      if [[ "$ref" == *.patch ]]; then
        IFS=+ read -r -a patches <<<"$ref"
        pack_patched "${patches[@]}" || exit 1
      else
        git archive --format=tar -o ".variants/${ref//\//-}.tar" "$ref" || exit 1
      fi
    done ;;
  prebuild) prebuild ;;
  build) build; pack_logs ;;
  ensure) mapfile -t names < <(unbuilt); [ ${#names[@]} -eq 0 ] || { build; pack_logs; } ;;
  sweep) sweep "$@"; pack_logs ;;
  run) build; sweep "$@"; pack_logs ;;
  test) run_tests "$@"; pack_logs ;;
  memcheck) run_memcheck; pack_logs ;;
  *)
    echo "usage: scripts/variants.sh pack REF... | prebuild | build | ensure | sweep [sweep.py arguments]" \
         "| run [sweep.py arguments] | test [pytest arguments] | memcheck" >&2
    exit 2 ;;
esac
