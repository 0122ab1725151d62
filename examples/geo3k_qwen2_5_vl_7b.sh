#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen2.5-VL-7B-Instruct: vlmrl's run of verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh,
# with the same overrides (verl's key paths run unchanged here). The pipeline is examples/geo3k_qwen2_5_vl_3b.sh's
# (same environment variables, same extra Hydra overrides); this script only picks the 7B model and run name.
#
# Needs: 8 GPUs with 80 GB each (one hybrid worker per GPU: FSDP2 policy + reference + vLLM engine, colocated), vlmrl
# and the CUDA build of vLLM installed (README, "GPU machines"), access to the Hugging Face Hub or local copies of
# the model and data. Where vLLM is not installed, append actor_rollout_ref.rollout.name=hf (transformers generate).
#
#   bash examples/geo3k_qwen2_5_vl_7b.sh                                   # 1 node x 8 GPUs
#   GPUS=4 bash examples/geo3k_qwen2_5_vl_7b.sh data.train_batch_size=256  # extra arguments are Hydra overrides
#   NNODES=2 bash examples/geo3k_qwen2_5_vl_7b.sh                          # after ray start on every node
#   SMOKE=1 DATA=/tmp/geo3k-smoke bash examples/geo3k_qwen2_5_vl_7b.sh     # tiny scale on any machine (see the 3B one)
set -euo pipefail
export MODEL=${MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
export EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_7b_function_rm}
exec bash "$(dirname "${BASH_SOURCE[0]}")/geo3k_qwen2_5_vl_3b.sh" "$@"
