#!/usr/bin/env bash
# The test command: installs what it needs (scripts/install.sh; a headless Chromium where apt can, for the report
# test: scripts/install_browser.sh; both idempotent), then runs the whole suite on CPU,
# vLLM tests included, in 2 processes (pytest-xdist; VLMRL_TEST_PROCS sets how many, 0 runs them in this one; tests
# marked serial run alone). Extra arguments go to pytest (e.g. -k reward, -m "not slow").
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
bash scripts/install_browser.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
exec "${VLMRL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q -p no:cacheprovider -n "${VLMRL_TEST_PROCS:-2}" \
  --dist worksteal "$@"
