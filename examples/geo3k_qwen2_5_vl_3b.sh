#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen2.5-VL-3B-Instruct: vlmrl's run of verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh
# (the same overrides, the 3B model; verl's key paths run unchanged here).
#
# Needs: 8 GPUs with 40 GB or more each (one hybrid worker per GPU: FSDP2 policy + reference + vLLM engine,
# colocated), vlmrl and the CUDA build of vLLM installed (README, "GPU machines"), access to the Hugging Face Hub or
# local copies of the model and data. Where vLLM is not installed, append actor_rollout_ref.rollout.name=hf
# (transformers generate).
#
#   bash examples/geo3k_qwen2_5_vl_3b.sh                                   # 1 node x 8 GPUs
#   GPUS=4 bash examples/geo3k_qwen2_5_vl_3b.sh data.train_batch_size=256  # extra arguments are Hydra overrides
#
# Several nodes: start a Ray cluster first, then launch on the head node only:
#   head:    ray start --head --port=6379
#   others:  ray start --address=HEAD_IP:6379
#   head:    NNODES=2 bash examples/geo3k_qwen2_5_vl_3b.sh   # joins the running cluster (trainer.ray_address=auto)
#
# Environment: DATA (parquet folder, default ~/data/geo3k; filled by preprocess/geo3k.py unless train.parquet and
# test.parquet are there), GEO3K (hub id or local copy for preprocess/geo3k.py, default hiyouga/geometry3k), MODEL,
# GPUS (per node, default 8), NNODES (default 1), RAY_ADDRESS (join this cluster), LOGGER (default
# [console,jsonl,wandb]; use [console,jsonl] without wandb), PROJECT, EXPERIMENT, PYTHON (default python), FAMILY
# (smoke mode: the tiny model's family, default qwen2_5_vl; examples/geo3k_qwen3_vl_8b.sh sets qwen3_vl).
# VLMRL_DRY_RUN=1 prints the commands instead of running them.
#
# Smoke mode, SMOKE=1: the whole pipeline at tiny scale on any machine (the test suite runs it). It swaps only what a
# laptop cannot hold: the model (the tiny random Qwen2.5-VL, or FAMILY's), the data (a stand-in in Geometry3K's own
# hub layout, made by python -m vlmrl.testing.smoke geo3k, then preprocessed by preprocess/geo3k.py as the real data
# is), the device and workers (2 CPU workers), wandb's network (WANDB_MODE=offline) and the scale (python -m
# vlmrl.testing.smoke overrides: 2 steps of 4 prompts, 48-token responses). Every other flag below runs as set: gradient checkpointing, the KL loss
# with its reference and the reference's parameter offload, validation before and after training, the checkpoint,
# the cache flag, CUDA graphs off/on as set (enforce_eager=False).
#   SMOKE=1 DATA=/tmp/geo3k-smoke bash examples/geo3k_qwen2_5_vl_3b.sh trainer.default_local_dir=/tmp/geo3k-run
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PYTHON=${PYTHON:-python}
DATA=${DATA:-$HOME/data/geo3k}
MODEL=${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}
GPUS=${GPUS:-8}
NNODES=${NNODES:-1}

run() {  # run a command, or print it (shell-quoted, one line) with VLMRL_DRY_RUN=1
  if [[ ${VLMRL_DRY_RUN:-0} == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

smoke=()
if [[ ${SMOKE:-0} == 1 ]]; then
  GEO3K=$("$PYTHON" -m vlmrl.testing.smoke geo3k --output "$DATA/source")
  MODEL=$("$PYTHON" -m vlmrl.testing.smoke model --family "${FAMILY:-qwen2_5_vl}")
  scale=$("$PYTHON" -m vlmrl.testing.smoke overrides)
  mapfile -t smoke <<< "$scale"
  export WANDB_MODE=offline
  rm -f "$DATA/train.parquet" "$DATA/test.parquet"  # preprocess the stand-in every time
fi

if [[ ! -f $DATA/train.parquet || ! -f $DATA/test.parquet ]]; then
  run "$PYTHON" preprocess/geo3k.py --input "${GEO3K:-hiyouga/geometry3k}" --output-dir "$DATA"
fi

cluster=()
if [[ $NNODES -gt 1 || -n ${RAY_ADDRESS:-} ]]; then
  cluster=("trainer.ray_address=${RAY_ADDRESS:-auto}")
fi

# verl's values, except: rollout.tensor_model_parallel_size stays 1 (vlmrl runs one vLLM engine per GPU) and
# rollout.free_cache_engine=True (in vlmrl: the engine sleeps, freeing its KV cache, while the policy trains).
run "$PYTHON" -m vlmrl.train \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/test.parquet" \
  data.train_batch_size=512 \
  data.max_prompt_length=1024 \
  data.max_response_length=2048 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  data.image_key=images \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.actor.ppo_mini_batch_size=128 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.01 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20 \
  actor_rollout_ref.rollout.name=vllm \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.enable_chunked_prefill=False \
  actor_rollout_ref.rollout.enforce_eager=False \
  actor_rollout_ref.rollout.free_cache_engine=True \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20 \
  actor_rollout_ref.ref.fsdp_config.param_offload=True \
  algorithm.use_kl_in_reward=False \
  trainer.critic_warmup=0 \
  "trainer.logger=${LOGGER:-[console,jsonl,wandb]}" \
  trainer.project_name="${PROJECT:-vlmrl_grpo_example_geo3k}" \
  trainer.experiment_name="${EXPERIMENT:-qwen2_5_vl_3b_function_rm}" \
  trainer.n_gpus_per_node="$GPUS" \
  trainer.nnodes="$NNODES" \
  trainer.save_freq=20 \
  trainer.test_freq=5 \
  trainer.total_epochs=15 \
  ${cluster[@]+"${cluster[@]}"} ${smoke[@]+"${smoke[@]}"} "$@"
