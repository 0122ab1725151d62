#!/usr/bin/env bash
# RL from a learned reward on CPU: train a tiny reward model on the colour task (candidate answers labelled right or
# wrong by the task's rule, Bradley-Terry), then the quick start's GRPO whose only reward is that model's score; the
# rule is logged beside it with weight 0, so the validation shows what the model's score is worth (README, "Rewards
# from a model"). Extra arguments are Hydra overrides for the GRPO run.
# OUT (default runs/reward_model) holds the pairs' data, the reward model and the run; SMOKE=1: 64 records, 20
# reward-model steps and 2 training steps (the test suite runs it).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
PY=${VLMRL_VENV:-$ROOT/.venv}/bin/python
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
OUT=${OUT:-$ROOT/runs/reward_model}
mkdir -p "$OUT"

MODEL=$("$PY" -c "from vlmrl.testing.tiny import ensure_tiny_model; print(ensure_tiny_model(seed=0))")
sizes=(--train-size 512 --test-size 96)
rm_steps=600
run=(trainer.total_training_steps=160 trainer.test_freq=40)
if [[ ${SMOKE:-0} == 1 ]]; then
  sizes=(--train-size 64 --test-size 16)
  rm_steps=20
  run=()
fi
"$PY" preprocess/synthetic.py --output-dir "$OUT/pairs" --families colour "${sizes[@]}" --image-size 112 --seed 0
"$PY" -m vlmrl.reward_model.train --model "$MODEL" --data "$OUT/pairs/train.parquet" \
  --val-data "$OUT/pairs/test.parquet" --output "$OUT/reward_model" --steps "$rm_steps" --seed 1 --overwrite

# reward_model.micro_batch_size_per_gpu=64: a worker's 64 samples in one forward (on a CPU the tiny model's forward
# is mostly per-call cost; 8, the default, makes 8 forwards a step)
OUT="$OUT" exec bash "$ROOT/examples/quickstart_cpu.sh" reward.function=null reward_model.enable=True \
  reward_model.model.path="$OUT/reward_model" reward_model.micro_batch_size_per_gpu=64 trainer.seed=1 \
  'reward.components=[{function: reward_model, name: rm, weight: 1.0}, {function: synthetic, name: rule, weight: 0.0}]' \
  ${run[@]+"${run[@]}"} "$@"
