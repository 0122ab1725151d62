#!/usr/bin/env bash
# An algorithm class of your own on the CPU quick start: the quick start's pipeline (tiny Qwen2.5-VL, synthetic
# colour task, vLLM rollout, 2 worker processes, reward curve and report) with examples/algorithms/length_aware.py:
# each response outside [min_length, max_length] generated tokens loses `penalty` from its reward before the
# advantages (algorithm.name plus the class's own parameters as algorithm.* keys). Extra arguments are Hydra
# overrides, e.g. bash examples/length_aware_cpu.sh +algorithm.max_length=3
# OUT (default runs/length_aware) is where data, metrics and plots go; SMOKE=1: 64 training records and 2 steps.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/runs/length_aware} exec bash "$ROOT/examples/quickstart_cpu.sh" \
  algorithm.name="$ROOT/examples/algorithms/length_aware.py:LengthAware" \
  +algorithm.min_length=1 +algorithm.max_length=5 +algorithm.penalty=1.0 +algorithm.patience=1000 "$@"
