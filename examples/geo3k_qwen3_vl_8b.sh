#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen3-VL-8B-Instruct on FSDP2 + vLLM: verl's examples/grpo_trainer/run_qwen3_vl-8b-megatron.sh
# has the recipe (its overrides, on Megatron); this is the same run on vlmrl's FSDP2 hybrid engine with the pipeline
# of examples/geo3k_qwen2_5_vl_3b.sh (same environment variables, same extra Hydra overrides). Qwen3-VL's differences
# (16-px patches, DeepStack, interleaved M-RoPE, timestamped video frames) are read from the checkpoint
# (vlmrl/models/families); nothing else changes.
#
# Needs: 8 GPUs with 80 GB each (one hybrid worker per GPU: FSDP2 policy + reference + vLLM engine, colocated), vlmrl
# and a CUDA build of vLLM that runs Qwen3-VL (README, "GPU machines"), access to the Hugging Face Hub or local copies
# of the model and data. Where vLLM is not installed, append actor_rollout_ref.rollout.name=hf.
#
#   bash examples/geo3k_qwen3_vl_8b.sh                                    # 1 node x 8 GPUs
#   GPUS=4 bash examples/geo3k_qwen3_vl_8b.sh data.train_batch_size=256   # extra arguments are Hydra overrides
#   MODEL=Qwen/Qwen3-VL-30B-A3B-Instruct EXPERIMENT=qwen3_vl_30b bash examples/geo3k_qwen3_vl_8b.sh  # the MoE one
#   SMOKE=1 DATA=/tmp/geo3k-smoke bash examples/geo3k_qwen3_vl_8b.sh      # tiny scale on any machine: the tiny Qwen3-VL
set -euo pipefail
export MODEL=${MODEL:-Qwen/Qwen3-VL-8B-Instruct}
export EXPERIMENT=${EXPERIMENT:-qwen3_vl_8b_function_rm}
export FAMILY=${FAMILY:-qwen3_vl}
exec bash "$(dirname "${BASH_SOURCE[0]}")/geo3k_qwen2_5_vl_3b.sh" "$@"
