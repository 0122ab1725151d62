#!/usr/bin/env bash
# Multi-turn tools on CPU: the tiny Qwen2.5-VL learns to call image_zoom before answering. The data (the synthetic
# zoom family: a small coloured square in an 896-pixel image strewn with dots) is shown to the model at 112 x 112
# pixels, where the square is three pixels among the dots; only the zoomed view (image_zoom cuts the 896-pixel
# original) shows its colour. Steps:
#   1. the tiny model with Qwen2.5's <tool_call> tokens (vlmrl.testing.tiny.TOOL_DEMO)
#   2. the data: preprocess/synthetic.py --families zoom
#   3. a warm start (python -m vlmrl.testing.warm_start): imitation of a scripted policy that calls image_zoom on the
#      centre in one first turn of four, names the colour after a zoom and answers a random colour otherwise
#      (examples/tool_zoom/teacher.py): the format, not the task
#   4. GRPO with the vLLM rollout and multi-turn tools (configs/tool_zoom_cpu.yaml), on 2 worker processes
#   5. the reward curve (PNG) and the run report (report.html; its validation gallery shows each turn and the
#      zoomed images)
# Extra arguments are Hydra overrides of step 4. OUT (default runs/tool_zoom) holds everything. NO_TOOLS=1 trains
# the same warm-started model without the tool (multi_turn off): the policy that never zooms, for comparison.
# SMOKE=1: the same pipeline at tiny scale (64 records, 5 warm-start steps, 2 GRPO steps; the test suite runs it).
# VLMRL_DRY_RUN=1 prints the commands of steps 2-5 instead of running them.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
PY=${VLMRL_VENV:-$ROOT/.venv}/bin/python
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
OUT=${OUT:-$ROOT/runs/tool_zoom}
mkdir -p "$OUT"

run() {  # run a command, or print it (shell-quoted, one line) with VLMRL_DRY_RUN=1
  if [[ ${VLMRL_DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

MODEL=$("$PY" -c "from vlmrl.testing.tiny import ensure_tiny_model, TOOL_DEMO; print(ensure_tiny_model(0, TOOL_DEMO))")
echo "[tool_zoom] tiny model: $MODEL" >&2
sizes=(--train-size 1024 --test-size 96)
warm=(--steps 300)
smoke=()
if [[ ${SMOKE:-0} == 1 ]]; then
  sizes=(--train-size 64 --test-size 16)
  warm=(--steps 5)
  smoke=(trainer.total_training_steps=2 trainer.test_freq=2)
fi
run "$PY" preprocess/synthetic.py --output-dir "$OUT/data" --families zoom --image-size 896 "${sizes[@]}" --seed 0 \
  --num-proc 2

run "$PY" -m vlmrl.testing.warm_start --model "$MODEL" --output "$OUT/warm_start" --data "$OUT/data/train.parquet" \
  --teacher examples/tool_zoom/teacher.py:write_turn --tools examples/tool_config/zoom.yaml --lr 2e-3 \
  --max-response-length 128 "${warm[@]}"

tools=()
if [[ ${NO_TOOLS:-0} == 1 ]]; then
  tools=(actor_rollout_ref.rollout.multi_turn.enable=false)
fi
run "$PY" -m vlmrl.train --config-name tool_zoom_cpu \
  data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/test.parquet" \
  actor_rollout_ref.model.path="$OUT/warm_start" trainer.default_local_dir="$OUT" \
  ${tools[@]+"${tools[@]}"} ${smoke[@]+"${smoke[@]}"} "$@"

run "$PY" -m vlmrl.trainer.tracking "$OUT/metrics.jsonl" "$OUT/reward_curve.png"
run "$PY" -m vlmrl.report "$OUT" --output "$OUT/report.html"
