#!/usr/bin/env bash
# Real images on CPU: scikit-learn's handwritten digits (1,797 real scans shipped inside its wheel, so nothing is
# downloaded: preprocess/digits.py), a supervised warm start on the small labelled part (200 records: the teacher
# writes each one's digit, examples/real_images/teacher.py), then GRPO on the other 1,237 prompts with the digit rule
# as its only reward, the held-out 360 scored greedily before the first step and as it trains (docs/real-images.md).
# Extra arguments are Hydra overrides for the GRPO run.
# MODEL_SIZE (tiny, 20m or 100m; default tiny) picks the random model's size (vlmrl.testing.tiny's presets) and the
# number of GRPO steps (100 for tiny, else 200; the held-out scans scored every quarter of them); OUT
# (default runs/real_images) holds the data, the warm-started model and the run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
PY=${VLMRL_VENV:-$ROOT/.venv}/bin/python
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
OUT=${OUT:-$ROOT/runs/real_images}
mkdir -p "$OUT"

SIZE=${MODEL_SIZE:-tiny}
MODEL=$("$PY" -c "import sys; from vlmrl.testing.tiny import SIZES, ensure_tiny_model as m
if sys.argv[1] not in SIZES: sys.exit(f'MODEL_SIZE={sys.argv[1]}: one of {\", \".join(SIZES)}')
print(m(seed=0, spec=SIZES[sys.argv[1]]))" "$SIZE")
echo "[real_images] random model: $MODEL ($SIZE)"
steps=100 # GRPO steps: 100 for the tiny model, 200 for the larger ones (they learn slower per step)
[[ $SIZE == tiny ]] || steps=200
"$PY" preprocess/digits.py --output-dir "$OUT/data" --image-size 56 --warm-size 200 --test-size 360 --seed 0
# the warm start is one process: it takes a thread per core (2 on 2 cores: 1.7x faster at 20m); nproc counts
# OMP_NUM_THREADS, hence env -u
OMP_NUM_THREADS=$(env -u OMP_NUM_THREADS nproc) "$PY" -m vlmrl.testing.warm_start --model "$MODEL" --output "$OUT/warm" \
  --data "$OUT/data/warm.parquet" --teacher "$ROOT/examples/real_images/teacher.py:write_turn" --steps 200 \
  --max-response-length 8 --max-assistant-turns 1

# the quick start's preset with a warm-started policy's settings: a 10x smaller learning rate and no entropy bonus
# (with the quick start's 2e-3 and 0.03, one tiny run's entropy rose from 0.9 to 6 within 5 steps, its answers ran
# to the 8-token cap and its held-out accuracy fell from 0.73 to 0.43 by step 20)
"$PY" -m vlmrl.train --config-name tiny_cpu \
  data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/test.parquet" \
  actor_rollout_ref.model.path="$OUT/warm" trainer.default_local_dir="$OUT" \
  trainer.project_name=real_images trainer.experiment_name="digits_$SIZE" \
  actor_rollout_ref.actor.optim.lr=2e-4 actor_rollout_ref.actor.entropy_coeff=0 \
  trainer.total_training_steps="$steps" trainer.test_freq=$((steps / 4)) "$@"

"$PY" -m vlmrl.trainer.tracking "$OUT/metrics.jsonl" "$OUT/reward_curve.png"
"$PY" -m vlmrl.report "$OUT" --output "$OUT/report.html"
