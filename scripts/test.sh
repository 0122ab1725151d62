#!/usr/bin/env bash
# The test command, in two tiers (README "Tests"):
#   bash scripts/test.sh          # the contributor tier: every test not marked `slow` (units, exactness checks, one
#                                 # short end-to-end run of the quick start); about 10 minutes on 2 cores
#   bash scripts/test.sh --all    # everything (CI): the contributor tier, then the `slow` tier (end-to-end runs,
#                                 # learning proofs, example pipelines)
# It installs what it needs (scripts/install.sh; a headless Chromium where apt can, for the report test:
# scripts/install_browser.sh; both idempotent), then runs each tier on CPU, vLLM tests included: first the tier's
# tests not marked `serial` in 2 processes (pytest-xdist; VLMRL_TEST_PROCS sets how many), then its serial ones (a
# bound on elapsed time, a whole-machine check) alone on a quiet machine (their pytest starts beside the parallel one
# and collects meanwhile, then waits for its end). VLMRL_TEST_PROCS=0 runs the tier's tests in
# one pytest, in order. First, tests/prepare.py builds what many tests share (the tiny models, the quick start's data,
# verl's preprocessed data; cached in $VLMRL_CACHE). Which tier a test is in is decided by measurement: tests/durations.json (each test's seconds
# in the last measured run, benchmarks/bench_suite.py) puts a test over 10 s in `slow` (tests/test_suite_tiers.py).
# Extra arguments go to every pytest run (e.g. -k reward; --junitxml=F.xml writes F.xml, F.serial.xml and, with
# --all, F.slow.xml and F.slow.serial.xml).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
tiers=(fast)
if [ "${1:-}" = "--all" ]; then
  tiers=(fast slow)
  shift
fi
bash scripts/install.sh
bash scripts/install_browser.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
pytest=("${VLMRL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q -p no:cacheprovider)
procs=${VLMRL_TEST_PROCS:-2}

# the pytest arguments of one run: --junitxml=DIR/NAME.xml -> DIR/NAME<suffix>.xml
args_for() {
  local suffix=$1
  shift
  for arg in "$@"; do
    case $arg in
      --junitxml=* | --junit-xml=*) printf '%s\0' "${arg%.xml}$suffix.xml" ;;
      *) printf '%s\0' "$arg" ;;
    esac
  done
}

echo "[tests] contributor tier: the builds many tests share (tests/prepare.py)"
"${pytest[0]}" tests/prepare.py || exit 1
set +e
codes=()
for tier in "${tiers[@]}"; do
  tag=$([ "$tier" = fast ] && echo "" || echo ".slow")
  name=$([ "$tier" = fast ] && echo "contributor tier" || echo "full tier: the slow tests")
  if [ "$procs" = 0 ]; then
    echo "[tests] $name, one process"
    mapfile -d '' run_args < <(args_for "$tag" "$@")
    VLMRL_TEST_TIER=$tier "${pytest[@]}" ${run_args[@]+"${run_args[@]}"}
    codes+=($?)
    continue
  fi
  # the serial pytest starts now and collects (its imports: ~15-25 s of one core) beside the parallel phase, where a
  # core is often idle, then waits for the parallel pytest to end (VLMRL_TEST_START_AFTER: tests/conftest.py) before
  # its first test
  turn=$(mktemp -d)
  mapfile -d '' run_args < <(args_for "$tag.serial" "$@")
  VLMRL_TEST_TIER=$tier VLMRL_TEST_PHASE=serial VLMRL_TEST_START_AFTER="$turn/go" "${pytest[@]}" \
    ${run_args[@]+"${run_args[@]}"} &
  serial=$!
  trap 'kill "$serial" 2>/dev/null' EXIT
  echo "[tests] $name, not serial, $procs processes"
  mapfile -d '' run_args < <(args_for "$tag" "$@")
  VLMRL_TEST_TIER=$tier VLMRL_TEST_PHASE=parallel "${pytest[@]}" -n "$procs" --dist worksteal \
    ${run_args[@]+"${run_args[@]}"}
  codes+=($?)
  echo "[tests] $name, serial, one at a time"
  touch "$turn/go"
  wait "$serial"
  codes+=($?)
  trap - EXIT
  rm -rf "$turn"
done
# 5: pytest collected nothing (a -k that leaves one of the runs empty)
for rc in "${codes[@]}"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
for rc in "${codes[@]}"; do
  if [ "$rc" = 0 ]; then exit 0; fi
done
exit 5
