#!/usr/bin/env bash
# Actor-critic PPO on the CPU quick start's task: the quick start's pipeline (tiny Qwen2.5-VL, synthetic colour task,
# vLLM rollout, 2 worker processes, reward curve and report) with configs/ppo_tiny_cpu.yaml: a critic from the same
# checkpoint and GAE advantages (algorithm.adv_estimator=gae). Extra arguments are Hydra overrides, e.g.
#   bash examples/ppo_cpu.sh algorithm.use_kl_in_reward=True algorithm.kl_ctrl.type=adaptive
# OUT (default runs/ppo) is where data, metrics and plots go; SMOKE=1: 64 training records and 2 steps.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONFIG=ppo_tiny_cpu OUT=${OUT:-$ROOT/runs/ppo} exec bash "$ROOT/examples/quickstart_cpu.sh" "$@"
