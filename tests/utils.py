"""Small builders shared by tests (not fixtures: plain functions)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from vlmrl.batch import PromptSample
from vlmrl.models import qwen_vl


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> Image.Image:
    """A plain RGB image."""
    return Image.new("RGB", size, colour)


def noise(seed: int, size: tuple[int, int] = (84, 56)) -> Image.Image:
    """A random RGB image (its features differ from any other seed's)."""
    import numpy as np

    arr = np.random.RandomState(seed).randint(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(arr)


def make_prompt(processor, text: str, images: list[Image.Image], index: int = 0, answer: str = "") -> PromptSample:
    """A PromptSample the way the dataset builds one: chat with image parts, resized images, one pad per image."""
    ip = processor.image_processor
    factor = qwen_vl.patch_factor(ip)
    lo, hi = qwen_vl.pixel_bounds(ip)
    resized = [qwen_vl.resize_image(im, factor, lo, hi) for im in images]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = qwen_vl.engine_prompt_ids(processor.tokenizer, prompt_text, len(images))
    return PromptSample(
        index=index,
        uid=f"test:{index}",
        data_source="test",
        messages=messages,
        prompt_text=prompt_text,
        prompt_ids=ids,
        images=resized,
        original_sizes=[im.size for im in images],
        ground_truth=answer,
        extra_info={},
    )


def verl_geo3k_launch_line(home: Path, free_cache_engine: bool = True) -> list[str]:
    """verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh overrides (ENGINE=vllm) as the shell passes them (verl at
    commit b178a3cd, January 2026: the copy in tests/verl_examples/ is the file itself)."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={home}/data/geo3k/train.parquet",
        f"data.val_files={home}/data/geo3k/test.parquet",
        "data.train_batch_size=512",
        "data.max_prompt_length=1024",
        "data.max_response_length=2048",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.image_key=images",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.use_fused_kernels=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=128",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.name=vllm",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.enable_chunked_prefill=False",
        "actor_rollout_ref.rollout.enforce_eager=False",
        f"actor_rollout_ref.rollout.free_cache_engine={free_cache_engine}",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','wandb']",
        "trainer.project_name=verl_grpo_example_geo3k",
        "trainer.experiment_name=qwen2_5_vl_7b_function_rm",
        "trainer.n_gpus_per_node=8",
        "trainer.nnodes=1",
        "trainer.save_freq=20",
        "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]
