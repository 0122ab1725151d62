#!/usr/bin/env bash
# GRPO for visual grounding: the model answers with a bounding box, the `grounding` reward scores it
# (0.9 x IoU with the true box, gated on the format, + 0.1 x format; rewards/recipes.py). Qwen2.5-VL-3B-Instruct.
#
# Input: DATA_JSONL (required), one JSON object per line; image paths are relative to IMAGE_DIR (default: the folder
# of the JSONL file); boxes are [x1, y1, x2, y2] in pixels of the ORIGINAL image (the reward maps the model's boxes,
# written in the resized image it saw, back to them); "bbox" may also be a list of such boxes (all must be found):
#   {"image": "images/0001.jpg", "question": "Where is the red mug left of the laptop?", "bbox": [412, 230, 498, 341]}
# The question may hold an <image> placeholder; without one, one is put in front. preprocess/jsonl.py turns the lines
# into parquet (DATA/train.parquet, and DATA/test.parquet from VAL_JSONL when given), appending an instruction to
# think in <think></think> and answer with the box in <answer></answer>. The box goes to reward_model.ground_truth and
# to extra_info.boxes.
#
# Needs: GPUs (default 8 on one node; one hybrid worker per GPU: FSDP2 policy + reference + vLLM engine, colocated),
# vlmrl and the CUDA build of vLLM installed (README, "GPU machines"). Where vLLM is not installed, append
# actor_rollout_ref.rollout.name=hf (transformers generate).
#
#   DATA_JSONL=refs/train.jsonl VAL_JSONL=refs/val.jsonl bash examples/grounding.sh
#   DATA_JSONL=refs/train.jsonl GPUS=4 bash examples/grounding.sh trainer.total_epochs=1   # extra Hydra overrides
#
# Several nodes: start a Ray cluster first (head: ray start --head --port=6379; each other node:
# ray start --address=HEAD_IP:6379), then launch on the head node with NNODES=N (it joins with trainer.ray_address).
#
# Environment: DATA_JSONL, VAL_JSONL, IMAGE_DIR; IMAGE_FIELD / QUESTION_FIELD / BBOX_FIELD (the key names above);
# DATA (parquet folder, default ~/data/grounding/<name of DATA_JSONL>; rebuilt when DATA_JSONL is newer than it),
# MODEL, GPUS (per node, default 8), NNODES (default 1), RAY_ADDRESS, LOGGER (default [console,jsonl,wandb]; use
# [console,jsonl] without wandb), PROJECT, EXPERIMENT, PYTHON (default python). VLMRL_DRY_RUN=1 prints the commands
# instead of running them.
#
# Smoke mode, SMOKE=1: the whole pipeline at tiny scale on any machine (the test suite runs it). It swaps only what a
# laptop cannot hold: the model (the tiny random Qwen2.5-VL), the data (JSONL lines in the format above with their
# images, made by python -m vlmrl.testing.smoke grounding into DATA/source unless DATA_JSONL is given, then preprocessed by
# preprocess/jsonl.py as real lines are), the device and workers (2 CPU workers), wandb's network
# (WANDB_MODE=offline) and the scale (python -m vlmrl.testing.smoke overrides). Every other flag below runs as set.
#   SMOKE=1 DATA=/tmp/grounding-smoke bash examples/grounding.sh trainer.default_local_dir=/tmp/grounding-run
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python}

smoke=()
if [[ ${SMOKE:-0} == 1 ]]; then
  DATA=${DATA:?SMOKE=1: set DATA to a scratch folder for the stand-in data and its parquet}
  if [[ -z ${DATA_JSONL:-} ]]; then
    jsonls=$(cd "$ROOT" && "$PYTHON" -m vlmrl.testing.smoke grounding --output "$DATA/source")
    read -r DATA_JSONL VAL_JSONL <<< "$jsonls"
  fi
  MODEL=$(cd "$ROOT" && "$PYTHON" -m vlmrl.testing.smoke model)
  scale=$(cd "$ROOT" && "$PYTHON" -m vlmrl.testing.smoke overrides)
  mapfile -t smoke <<< "$scale"
  export WANDB_MODE=offline
  rm -f "$DATA/train.parquet" "$DATA/test.parquet"
fi

if [[ -z ${DATA_JSONL:-} ]]; then
  echo "grounding.sh: set DATA_JSONL to the training records, one JSON object per line such as" >&2
  echo '  {"image": "images/0001.jpg", "question": "Where is the red mug?", "bbox": [412, 230, 498, 341]}' >&2
  echo "e.g. DATA_JSONL=refs/train.jsonl bash examples/grounding.sh (the line format is in the header of this file)" >&2
  exit 2
fi
for f in "$DATA_JSONL" ${VAL_JSONL:+"$VAL_JSONL"}; do
  if [[ ! -f $f ]]; then
    echo "grounding.sh: $f: no such file (DATA_JSONL / VAL_JSONL)" >&2
    exit 2
  fi
done
# absolute paths: the commands below run from the repository root
DATA_JSONL=$(cd "$(dirname "$DATA_JSONL")" && pwd)/$(basename "$DATA_JSONL")
if [[ -n ${VAL_JSONL:-} ]]; then
  VAL_JSONL=$(cd "$(dirname "$VAL_JSONL")" && pwd)/$(basename "$VAL_JSONL")
fi
if [[ -n ${IMAGE_DIR:-} ]]; then
  IMAGE_DIR=$(cd "$IMAGE_DIR" && pwd)
fi
cd "$ROOT"

name=$(basename "$DATA_JSONL")
DATA=${DATA:-$HOME/data/grounding/${name%.*}}
MODEL=${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}
GPUS=${GPUS:-8}
NNODES=${NNODES:-1}
BBOX_FIELD=${BBOX_FIELD:-bbox}
INSTRUCTION="First think about where it is as an internal monologue inside <think> </think> tags, then give the \
bounding box of each object asked for as [x1, y1, x2, y2] in pixel coordinates inside <answer> </answer> tags."

run() {  # run a command, or print it (shell-quoted, one line) with VLMRL_DRY_RUN=1
  if [[ ${VLMRL_DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

preprocess() {  # preprocess JSONL SPLIT: DATA/SPLIT.parquet, unless it is newer than JSONL
  if [[ -f $DATA/$2.parquet && $DATA/$2.parquet -nt $1 ]]; then
    return
  fi
  run "$PYTHON" preprocess/jsonl.py --input "$1" ${IMAGE_DIR:+--image-dir "$IMAGE_DIR"} --output-dir "$DATA" \
    --split "$2" --data-source grounding --ability grounding --instruction "$INSTRUCTION" --prepend-images \
    --images-field "${IMAGE_FIELD:-image}" --question-field "${QUESTION_FIELD:-question}" \
    --answer-field "$BBOX_FIELD" --boxes-field "$BBOX_FIELD"
}

preprocess "$DATA_JSONL" train
extra=()
if [[ -n ${VAL_JSONL:-} ]]; then
  preprocess "$VAL_JSONL" test
  extra+=("data.val_files=$DATA/test.parquet")
fi
if [[ $NNODES -gt 1 || -n ${RAY_ADDRESS:-} ]]; then
  extra+=("trainer.ray_address=${RAY_ADDRESS:-auto}")
fi

# images are resized to at most max_pixels (1280 image tokens); boxes are scored in original pixels either way
run "$PYTHON" -m vlmrl.train \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" \
  data.train_batch_size=128 \
  data.max_prompt_length=2048 \
  data.max_response_length=1024 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.image_key=images \
  data.max_pixels=1003520 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.name=vllm \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.enforce_eager=False \
  actor_rollout_ref.rollout.free_cache_engine=True \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.fsdp_config.param_offload=True \
  reward.function=grounding \
  "trainer.logger=${LOGGER:-[console,jsonl,wandb]}" \
  trainer.project_name="${PROJECT:-vlmrl_grpo_grounding}" \
  trainer.experiment_name="${EXPERIMENT:-qwen2_5_vl_3b_${name%.*}}" \
  trainer.n_gpus_per_node="$GPUS" \
  trainer.nnodes="$NNODES" \
  trainer.save_freq=50 \
  trainer.test_freq=10 \
  trainer.total_epochs=5 \
  ${extra[@]+"${extra[@]}"} ${smoke[@]+"${smoke[@]}"} "$@"
