#!/usr/bin/env bash
# CPU quick start: build the tiny Qwen2.5-VL, generate the synthetic colour task, train GRPO with the vLLM rollout
# on 2 worker processes, then print the reward curve, write it as a PNG and write the run report (report.html:
# every metric's panel, health checks, validation samples). Extra arguments are Hydra overrides, e.g.
#   bash examples/quickstart_cpu.sh trainer.total_training_steps=200 actor_rollout_ref.rollout.name=hf
# OUT (default runs/quickstart) is where data, metrics, checkpoints and plots go. Smoke mode, SMOKE=1: the same
# pipeline with 64 training records and 2 steps (the test suite runs it; a few seconds of training). CONFIG (default
# tiny_cpu) names the configs/ preset: examples/ppo_cpu.sh runs this script with CONFIG=ppo_tiny_cpu. FAMILY (default
# qwen2_5_vl) picks the tiny model's family: FAMILY=qwen3_vl trains the tiny Qwen3-VL (16-px patches, DeepStack,
# interleaved M-RoPE) on the same task, FAMILY=glm4v the tiny GLM-4.1V (GLM's tokens, chat template and decoder),
# FAMILY=internvl the tiny InternVL (tiled images, a Qwen2 decoder with 1-D RoPE; it takes the default 120 steps),
# FAMILY=smolvlm the tiny SmolVLM (a grid of tiles behind row/column tokens, a Llama decoder with 1-D RoPE),
# FAMILY=llava_onevision the tiny LLaVA-OneVision (anyres patches with newline rows, a Qwen2 decoder, 1-D RoPE),
# FAMILY=gemma3 the tiny Gemma 3 (image tokens attending both ways, a sliding-window layer) with the HF rollout
# (vLLM's CPU attention cannot attend both ways inside an image).
# QUICKSTART_DATA names a folder holding the task's train.parquet and test.parquet from an earlier run (its
# $OUT/data): the script trains on them as they are and skips the data step.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
PY=${VLMRL_VENV:-$ROOT/.venv}/bin/python
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export VLMRL_CACHE=${VLMRL_CACHE:-$ROOT/.cache/vlmrl}
OUT=${OUT:-$ROOT/runs/quickstart}
mkdir -p "$OUT"

FAMILY=${FAMILY:-qwen2_5_vl}
MODEL=$("$PY" -c "import sys; from vlmrl.testing.tiny import FAMILY_SPECS as F, ensure_tiny_model as m
print(m(seed=0, spec=F[sys.argv[1]]))" "$FAMILY")
echo "[quickstart] tiny model: $MODEL ($FAMILY)"
family=()
if [[ $FAMILY == gemma3 ]]; then
  family=(actor_rollout_ref.rollout.name=hf)
fi
sizes=(--train-size 4096 --test-size 96)
smoke=()
if [[ ${SMOKE:-0} == 1 ]]; then
  sizes=(--train-size 64 --test-size 16)
  smoke=(trainer.total_training_steps=2)
fi
DATA=${QUICKSTART_DATA:-}
if [[ -n $DATA ]]; then
  for split in train test; do
    if [[ ! -f $DATA/$split.parquet ]]; then
      echo "[quickstart] QUICKSTART_DATA=$DATA holds no $split.parquet (a folder an earlier run wrote: its \$OUT/data)" >&2
      exit 2
    fi
  done
  echo "[quickstart] data: $DATA (QUICKSTART_DATA, as it is)"
else
  DATA=$OUT/data
  "$PY" preprocess/synthetic.py --output-dir "$DATA" --families colour "${sizes[@]}" --image-size 112 --seed 0
fi

"$PY" -m vlmrl.train --config-name "${CONFIG:-tiny_cpu}" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  actor_rollout_ref.model.path="$MODEL" trainer.default_local_dir="$OUT" ${smoke[@]+"${smoke[@]}"} ${family[@]+"${family[@]}"} "$@"

"$PY" -m vlmrl.trainer.tracking "$OUT/metrics.jsonl" "$OUT/reward_curve.png"
"$PY" -m vlmrl.report "$OUT" --output "$OUT/report.html"
