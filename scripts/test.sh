#!/usr/bin/env bash
# The test command: installs what it needs (scripts/install.sh; a headless Chromium where apt can, for the report
# test: scripts/install_browser.sh; both idempotent), then runs the whole suite on CPU, vLLM tests included: first
# every test not marked serial in 2 processes (pytest-xdist; VLMRL_TEST_PROCS sets how many), then the serial ones
# (a bound on elapsed time, a whole-machine check) alone on a quiet machine. VLMRL_TEST_PROCS=0 runs everything in
# one pytest, in order. Extra arguments go to both pytest runs (e.g. -k reward, -m "not slow"; --junitxml=F.xml
# writes the serial run's results to F.serial.xml).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
bash scripts/install_browser.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
pytest=("${VLMRL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q -p no:cacheprovider)
procs=${VLMRL_TEST_PROCS:-2}
if [ "$procs" = 0 ]; then
  exec "${pytest[@]}" "$@"
fi
set +e
echo "[tests] not serial, $procs processes"
VLMRL_TEST_PHASE=parallel "${pytest[@]}" -n "$procs" --dist worksteal "$@"
parallel=$?
echo "[tests] serial, one at a time"
# the second run's JUnit file beside the first's: --junitxml=DIR/NAME.xml -> DIR/NAME.serial.xml
serial_args=()
for arg in "$@"; do
  case $arg in
    --junitxml=* | --junit-xml=*) serial_args+=("${arg%.xml}.serial.xml") ;;
    *) serial_args+=("$arg") ;;
  esac
done
VLMRL_TEST_PHASE=serial "${pytest[@]}" ${serial_args[@]+"${serial_args[@]}"}
serial=$?
# 5: pytest collected nothing (a -k or -m that leaves one of the two runs empty)
for rc in "$parallel" "$serial"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
if [ "$parallel" = 5 ] && [ "$serial" = 5 ]; then exit 5; fi
exit 0
