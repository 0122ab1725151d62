"""The config schema: typed dataclasses, one docstring per field, registered with Hydra's ConfigStore.

Key paths follow verl's (``data.train_files``, ``actor_rollout_ref.rollout.n``, ``trainer.logger`` ...) so a verl
launch line runs unchanged. This module is the single place that says which keys exist; ``validate_overrides``
rejects an unknown key before any expensive start-up and names the nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

# ----------------------------------------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    train_files: Any = MISSING
    """Parquet file or list of files for training (verl's record schema)."""
    val_files: Any = None
    """Parquet file or list of files for validation; None disables validation."""
    prompt_key: str = "prompt"
    """Column holding the chat list ``[{role, content}]`` with one ``<image>`` per image."""
    image_key: str = "images"
    """Column holding the list of ``{bytes, path}`` image structs."""
    max_prompt_length: int = 1024
    """Longest prompt in tokens, image tokens included."""
    max_response_length: int = 512
    """Longest response in tokens (the rollout's max_tokens)."""
    train_batch_size: int = 16
    """Prompts per training step (each sampled ``rollout.n`` times)."""
    val_batch_size: int | None = None
    """Prompts per validation batch; None = the whole validation set at once."""
    filter_overlong_prompts: bool = True
    """Drop (and report) prompts longer than max_prompt_length. Prompts with images are never truncated."""
    truncation: str = "error"
    """What to do with an overlong text-only prompt that is not filtered: error | left | right."""
    min_pixels: int | None = None
    """Smallest image area after resizing (qwen-vl-utils rules); None = the processor's value."""
    max_pixels: int | None = None
    """Largest image area after resizing; None = the processor's value."""
    custom_chat_template: str | None = None
    """A Jinja chat template used instead of the processor's (rendered sandboxed)."""
    seed: int = 1
    """Seed of the sampler's shuffle order."""
    shuffle: bool = True
    """Shuffle the training set each epoch."""
    system_prompt: str | None = None
    """A system message prepended to every prompt that has none."""
    dataloader_num_workers: int = 0
    """Threads that decode and resize a batch's images (``RLDataset.get_batch``); 0 or 1 = the calling thread."""
    gen_batch_size: int | None = None
    """verl/DAPO: prompts per rollout batch with ``algorithm.filter_groups``. vlmrl rolls out train_batch_size
    prompts per batch, so only None or the value of train_batch_size is accepted."""
    return_raw_chat: bool = False
    """verl compatibility: vlmrl always keeps each prompt's chat messages (rewards see them); accepted either way."""
    return_raw_input_ids: bool = False
    """verl compatibility (re-tokenising for a reward model; vlmrl has none): accepted either way, no effect."""
    return_full_prompt: bool = False
    """verl compatibility: rewards always get the rendered prompt (``RewardSample.prompt``); accepted either way."""


# ---------------------------------------------------------------------------------------------- actor/rollout/ref


@dataclass
class ModelConfig:
    path: str = MISSING
    """HF folder or hub id of a Qwen2.5-VL checkpoint."""
    trust_remote_code: bool = False
    """Passed to transformers' and vLLM's loaders."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    use_remove_padding: bool = True
    """verl compatibility: vlmrl always trims padding per micro-batch, so this is accepted either way."""
    freeze_vision_tower: bool = False
    """Keep the vision tower's weights fixed (it still runs, and is still pushed once to the engine)."""
    lora_rank: int = 0
    """LoRA rank on the language model's linear layers (0 = full fine-tuning). The vision tower is excluded."""
    lora_alpha: int = 16
    """LoRA alpha."""
    target_modules: Any = "all-linear"
    """LoRA target modules (peft syntax) inside the language model."""
    use_liger: bool = False
    """verl's Liger-kernel patching; not implemented, True is rejected."""
    use_fused_kernels: bool = False
    """verl's fused log-prob/entropy kernels; not implemented, True is rejected."""
    enable_activation_offload: bool = False
    """verl's activation offloading to CPU; not implemented, True is rejected (use enable_gradient_checkpointing)."""


@dataclass
class OptimConfig:
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    lr_warmup_steps: int = -1
    """Linear warm-up steps; -1 = use lr_warmup_steps_ratio."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a fraction of the total training steps."""
    warmup_style: str = "constant"
    """Schedule after warm-up: constant | cosine."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of lr."""


@dataclass
class FSDPConfig:
    param_offload: bool = False
    """Keep parameters on CPU between uses (FSDP2 CPUOffloadPolicy; GPU only)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU (implied by param_offload in FSDP2)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after each forward (ZeRO-3 style)."""
    fsdp_size: int = -1
    """verl's FSDP group size; -1 = shard over all workers, the only layout vlmrl has (other values are rejected)."""


@dataclass
class ActorConfig:
    strategy: str = "fsdp2"
    """Training backend: fsdp | fsdp2 (both mean PyTorch FSDP2 in vlmrl); megatron is rejected."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (x rollout.n samples), as in verl."""
    ppo_micro_batch_size_per_gpu: int = 8
    """Samples per forward/backward pass on one worker."""
    use_dynamic_bsz: bool = False
    """verl's token-budget micro-batches; not implemented, True is rejected (padding is trimmed per micro-batch)."""
    ppo_max_token_len_per_gpu: int = 16384
    """verl's token budget for use_dynamic_bsz; accepted and unused (use_dynamic_bsz must be False)."""
    ulysses_sequence_parallel_size: int = 1
    """verl's Ulysses sequence parallelism; not implemented, only 1 is accepted."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    clip_ratio: float = 0.2
    """PPO clip range (both sides unless clip_ratio_low/high are set)."""
    clip_ratio_low: float | None = None
    """Lower clip (1 - low); None = clip_ratio."""
    clip_ratio_high: float | None = None
    """Upper clip (1 + high); None = clip_ratio. DAPO's clip-higher uses 0.28."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (> 1; 0 disables)."""
    loss_agg_mode: str = "token-mean"
    """token-mean | seq-mean-token-mean | seq-mean-token-sum-norm."""
    policy_loss: str = "ppo"
    """Policy loss by registry name, or ``path/to/file.py:fn``."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient (entropy is always logged)."""
    use_kl_loss: bool = False
    """Add a KL penalty against the frozen reference to the loss (builds the reference model)."""
    kl_loss_coef: float = 0.001
    """KL loss coefficient."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: k1 | k2 | low_var_kl (k3) | abs | mse."""
    grad_clip: float = 1.0
    """Max gradient norm."""
    shuffle: bool = False
    """Shuffle samples before splitting into mini-batches."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class RefConfig:
    strategy: str = "fsdp2"
    """Reference model backend: fsdp | fsdp2 (both mean FSDP2); megatron is rejected."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per reference forward; None = actor.ppo_micro_batch_size_per_gpu."""
    log_prob_use_dynamic_bsz: bool = False
    """verl's token-budget micro-batches; not implemented, True is rejected."""
    log_prob_max_token_len_per_gpu: int = 16384
    """verl's token budget for log_prob_use_dynamic_bsz; accepted and unused."""
    ulysses_sequence_parallel_size: int = 1
    """verl's Ulysses sequence parallelism; not implemented, only 1 is accepted."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)


@dataclass
class ValKwargs:
    n: int = 1
    """Samples per validation prompt."""
    do_sample: bool = False
    """False = greedy validation."""
    temperature: float = 0.0
    """Validation temperature when do_sample is True."""
    top_p: float = 1.0
    """Validation top-p."""
    top_k: int = -1
    """Validation top-k (-1 = off)."""


@dataclass
class MultiTurnConfig:
    enable: bool = False
    """verl's multi-turn / tool-calling rollout; not implemented (one response per prompt), True is rejected."""


@dataclass
class RolloutConfig:
    name: str = "vllm"
    """Rollout engine: vllm | hf."""
    mode: str = "sync"
    """verl's rollout mode: sync (the engine runs in each worker's process, the only mode); async is rejected."""
    n: int = 8
    """Samples per prompt (the GRPO group size)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling."""
    top_k: int = -1
    """Top-k sampling (-1 = off)."""
    dtype: str = "auto"
    """Engine dtype: auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16."""
    gpu_memory_utilization: float = 0.5
    """vLLM's share of GPU memory (weights + KV cache)."""
    tensor_model_parallel_size: int = 1
    """verl key, used as 1: each worker runs its own engine with the whole model (a larger value is warned about)."""
    max_model_len: int | None = None
    """Engine context length; None = max_prompt_length + max_response_length."""
    max_num_batched_tokens: int | None = None
    """vLLM scheduler budget per step; None = engine default."""
    enforce_eager: bool = True
    """Disable CUDA graphs (faster start, slower decode)."""
    enable_chunked_prefill: bool | None = None
    """vLLM chunked prefill; None = engine default."""
    free_cache_engine: bool = True
    """On GPU, put the engine to sleep (free KV cache, offload weights) while training."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per old-log-prob forward; None = actor.ppo_micro_batch_size_per_gpu."""
    log_prob_use_dynamic_bsz: bool = False
    """verl's token-budget micro-batches; not implemented, True is rejected."""
    log_prob_max_token_len_per_gpu: int = 16384
    """verl's token budget for log_prob_use_dynamic_bsz; accepted and unused."""
    limit_images: int | None = None
    """Max images per prompt for the engine; None = read from the data."""
    ignore_eos: bool = False
    """Always generate max_tokens (benchmarks)."""
    seed: int = 0
    """Sampling seed (per worker: seed + rank)."""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}})
    """Extra engine arguments: ``engine_kwargs.vllm.<arg>`` pass to ``vllm.LLM``; unknown ones are an error."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Policy, reference and rollout engine share one worker process (the only mode)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


# ------------------------------------------------------------------------------------------------ algorithm/reward


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all equal, and roll out more prompts to refill."""
    metric: str = "score"
    """Reward component whose variance decides (score = the total)."""
    max_num_gen_batches: int = 4
    """Most rollout batches per step before training on what was kept (0 = unbounded)."""


@dataclass
class KLCtrlConfig:
    """verl's controller of the in-reward KL coefficient; vlmrl has no in-reward KL, so these are accepted and unused
    (as in verl with ``algorithm.use_kl_in_reward=False``)."""

    type: str = "fixed"
    """fixed | adaptive (unused)."""
    kl_coef: float = 0.001
    """In-reward KL coefficient (unused; the KL loss uses actor.kl_loss_coef)."""
    horizon: int = 10000
    """Adaptive controller horizon (unused)."""
    target_kl: float = 0.1
    """Adaptive controller target (unused)."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """grpo | dr_grpo | rloo | reinforce_plus_plus, or ``path/to/file.py:fn``."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (False = Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """verl's in-reward KL penalty; not supported (use actor.use_kl_loss), True is rejected."""
    kl_penalty: str = "kl"
    """verl's estimator for the in-reward KL; accepted and unused (the KL loss uses actor.kl_loss_type)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    gamma: float = 1.0
    """Discount factor. The estimators here score whole responses (outcome reward, gamma 1): only 1.0 is accepted."""
    lam: float = 1.0
    """GAE's lambda; vlmrl has no GAE (no critic), so it is accepted and unused, as verl ignores it for GRPO."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = None
    """A Python file holding the reward function (trusted code named by the launcher); when set it scores every
    sample that no ``reward.dispatch`` entry claims. verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info=None, **kw)`` and vlmrl's ``fn(sample)`` (a RewardSample, images included) are both accepted."""
    name: str = "compute_score"
    """Function name in that file."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to every call of the selected function (``path`` above, or
    ``reward.function``); components take theirs in ``reward.components[i].kwargs``."""


@dataclass
class RewardConfig:
    function: str | None = None
    """Reward by registry name (``synthetic``, ``geo3k``, ``accuracy``, ``format``, ``iou``, ``similarity``...; see
    ``vlmrl.reward.registered_names()``), ``path/to/file.py:fn`` or ``package.module:fn``; used when
    custom_reward_function.path and components are unset. All unset: built-in dispatch by data_source (geo3k,
    hiyouga/geometry3k -> geo3k; synthetic/* -> synthetic)."""
    components: list[Any] = field(default_factory=list)
    """Composite reward: list of ``{function, weight=1, kwargs={}, gate=None, gate_threshold=0.5, name}``; total =
    sum of weight * value over components whose gate component scored >= gate_threshold."""
    dispatch: dict[str, Any] = field(default_factory=dict)
    """Per-data_source rewards for mixed datasets: ``{data_source or glob: name | {function, kwargs} |
    {components}}``; sources not listed use the selection above."""
    num_workers: int = 0
    """Reward worker processes. 0 = in the driver (a timed-out call is interrupted, which stops Python code but not a
    call blocked in C such as a socket read); N >= 1 = N processes, a timed-out one is killed and replaced."""
    timeout_s: float = 30.0
    """Per-sample timeout in seconds (<= 0 disables it)."""
    on_error: str = "fallback"
    """An exception, timeout, NaN/inf or non-number result: fallback (score it fallback_score, count it in
    reward/errors, log the first of each kind with the sample) | raise (fail the step, naming the sample)."""
    fallback_score: float = 0.0
    """Score given to a sample whose reward failed."""
    max_failed_ratio: float = 1.0
    """Stop the run, with the first error and its traceback, when at least this fraction of a batch's reward calls
    fail (1.0: only when every one failed, e.g. a reward whose signature or import is wrong for this data)."""


@dataclass
class RewardModelConfig:
    """verl's ``reward_model`` section. Only the rule-based path exists: no reward model, one reward manager."""

    enable: bool = False
    """verl's model-based reward; not supported, True is rejected (use reward.function or custom_reward_function)."""
    reward_manager: str = "naive"
    """verl's reward manager: only naive (score each sample with the reward function, what vlmrl's manager does)."""


# --------------------------------------------------------------------------------------------------------- trainer


@dataclass
class TrainerConfig:
    project_name: str = "vlmrl"
    """Tracking project name."""
    experiment_name: str = "run"
    """Tracking run name."""
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, tensorboard, wandb."""
    device: str = "auto"
    """auto (cuda when available) | cuda | cpu."""
    nnodes: int = 1
    """Machines in the Ray cluster used for training."""
    n_gpus_per_node: int = 1
    """GPUs per machine (one hybrid worker each)."""
    cpu_workers: int = 2
    """Hybrid workers when training on CPU."""
    total_epochs: int = 1
    """Epochs over the training set."""
    total_training_steps: int | None = None
    """Cap on training steps (overrides total_epochs)."""
    seed: int = 1
    """Seed of model-side randomness (sampling, dropout)."""
    save_freq: int = -1
    """Checkpoint every N steps (-1 = never, except at the end if > 0)."""
    max_ckpt_to_keep: int | None = None
    """Keep only the newest N checkpoints (None = all)."""
    max_actor_ckpt_to_keep: int | None = None
    """verl's name for max_ckpt_to_keep (used when that is unset)."""
    resume_mode: str = "auto"
    """auto (latest in default_local_dir) | disable | resume_path."""
    resume_from_path: str | None = None
    """Checkpoint folder for resume_mode=resume_path."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoints, metrics.jsonl and plots go here."""
    test_freq: int = -1
    """Validate every N steps (-1 = only at the end when val_files is set)."""
    val_before_train: bool = False
    """Validate before the first step."""
    val_only: bool = False
    """Only validate (a checkpoint or the initial model), then exit."""
    log_val_generations: int = 16
    """Validation samples shown in the HTML gallery written at each validation (0 = no gallery)."""
    rollout_data_dir: str | None = None
    """Dump every step's samples (prompt, response, rewards) as JSON lines here."""
    critic_warmup: int = 0
    """verl compatibility: GRPO has no critic, only 0 is accepted."""
    balance_batch: bool = True
    """verl compatibility (reorders samples to balance tokens per worker): vlmrl splits each batch's prompts evenly
    over the workers in order; accepted either way, no effect."""
    default_hdfs_dir: str | None = None
    """verl's HDFS checkpoint copy; not implemented, only None is accepted."""
    ray_address: str | None = None
    """Ray cluster address (None = start or join a local one; ``auto`` = the running cluster)."""
    use_ray: bool = True
    """False = one hybrid worker in the driver's own process (one device; cpu_workers / n_gpus_per_node are ignored;
    no Ray needed: debugging, a single GPU)."""


@dataclass
class VLMRLConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------------------------- helpers

_MEGATRON = "vlmrl trains with FSDP2 only (Megatron is not supported)"
_DYN_BSZ = (
    "token-budget micro-batches are not implemented; size micro-batches with the matching "
    "*micro_batch_size_per_gpu key instead (padding is trimmed per micro-batch)"
)
_REWARD_MODEL = (
    "model-based reward models are not supported; use a reward function: reward.function, reward.components or "
    "custom_reward_function.path"
)
_OVERLONG = (
    "DAPO's overlong penalty is the length_penalty reward component in vlmrl: reward.components=[{function: "
    "<task reward>}, {function: length_penalty, kwargs: {buffer_len: N, penalty_factor: F}}]"
)

# keys of verl that are not in the schema and name features vlmrl does not implement: an override naming one (or a key
# below it; the longest matching entry wins) is rejected with this reason. Checked after the schema, so e.g.
# ``reward_model.enable`` (a schema key) is accepted while any other ``reward_model.*`` key gets the reason.
UNSUPPORTED: dict[str, str] = {
    "critic": "GRPO-family estimators need no critic; vlmrl has none",
    "actor_rollout_ref.actor.megatron": _MEGATRON,
    "actor_rollout_ref.ref.megatron": _MEGATRON,
    "reward_model": _REWARD_MODEL,
    "reward_model.overlong_buffer": _OVERLONG,
    "actor_rollout_ref.rollout.multi_turn": "multi-turn / tool-calling rollouts are not implemented (only "
    "actor_rollout_ref.rollout.multi_turn.enable=False is accepted)",
    "actor_rollout_ref.model.custom_chat_template": "vlmrl reads the chat template from data.custom_chat_template",
}

# schema keys kept for verl launch lines whose other values name features vlmrl does not implement:
# key -> (accepted values, reason). ``reject_unsupported_values`` (called by ``to_object``) enforces them.
UNSUPPORTED_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "actor_rollout_ref.actor.strategy": (("fsdp", "fsdp2"), _MEGATRON),
    "actor_rollout_ref.ref.strategy": (("fsdp", "fsdp2"), _MEGATRON),
    "actor_rollout_ref.actor.use_dynamic_bsz": ((False,), _DYN_BSZ),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": ((False,), _DYN_BSZ),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": ((False,), _DYN_BSZ),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": ((1,), "sequence parallelism is not implemented"),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": ((1,), "sequence parallelism is not implemented"),
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": ((-1,), "vlmrl shards over all workers (no hybrid sharding)"),
    "actor_rollout_ref.ref.fsdp_config.fsdp_size": ((-1,), "vlmrl shards over all workers (no hybrid sharding)"),
    "actor_rollout_ref.model.use_liger": ((False,), "Liger kernels are not integrated"),
    "actor_rollout_ref.model.use_fused_kernels": ((False,), "fused log-prob/entropy kernels are not integrated"),
    "actor_rollout_ref.model.enable_activation_offload": (
        (False,),
        "activation offloading is not implemented; use actor_rollout_ref.model.enable_gradient_checkpointing=True",
    ),
    "actor_rollout_ref.rollout.mode": (
        ("sync",),
        "the async (agent-loop server) rollout is not implemented; vLLM runs inside each worker (sync)",
    ),
    "actor_rollout_ref.rollout.multi_turn.enable": (
        (False,),
        "multi-turn / tool-calling rollouts are not implemented; vlmrl samples one response per prompt",
    ),
    "algorithm.use_kl_in_reward": (
        (False,),
        "the in-reward KL penalty is not implemented; use actor_rollout_ref.actor.use_kl_loss=True "
        "(the KL loss against the reference model) instead",
    ),
    "algorithm.gamma": ((1.0,), "the estimators here score whole responses (outcome reward): nothing to discount"),
    "reward_model.enable": ((False,), _REWARD_MODEL),
    "reward_model.reward_manager": (
        ("naive",),
        "vlmrl's reward manager scores every sample with the reward function (verl's naive); for DAPO's overlong "
        "penalty add the length_penalty component to reward.components, for parallel scoring set reward.num_workers",
    ),
    "trainer.default_hdfs_dir": ((None,), "copying checkpoints to HDFS is not implemented"),
}

# mandatory keys (MISSING in the schema) and how to set them
_REQUIRED_HINTS: dict[str, str] = {
    "actor_rollout_ref.model.path": "point it at a Qwen2.5-VL folder or hub id, "
    "e.g. actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-3B-Instruct",
    "data.train_files": "give a parquet file or a list of them (preprocess/ writes them), "
    "e.g. data.train_files=$HOME/data/geo3k/train.parquet",
}

# dict-typed fields: any key below them is valid (passed through and checked by their consumer)
_OPEN_DICTS = ("actor_rollout_ref.rollout.engine_kwargs", "custom_reward_function.reward_kwargs", "reward.dispatch")


def register() -> None:
    """Register the schema with Hydra's ConfigStore as ``vlmrl_schema``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="vlmrl_schema", node=VLMRLConfig)


def leaf_keys(cls: type = VLMRLConfig, prefix: str = "") -> list[str]:
    """All dotted leaf key paths of a config dataclass."""
    return list(_leaf_keys(cls, prefix))


@functools.cache
def _leaf_keys(cls: type, prefix: str) -> tuple[str, ...]:
    import typing

    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = hints.get(f.name)
        if dataclasses.is_dataclass(sub):
            out.extend(_leaf_keys(sub, key + "."))
        else:
            out.append(key)
    return tuple(out)


def nearest_key(key: str) -> str | None:
    """The valid key path closest to ``key`` (by edit similarity of the full path and of its last part)."""
    keys = leaf_keys() + list(_OPEN_DICTS)
    hit = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if hit:
        return hit[0]
    last = key.rsplit(".", 1)[-1]
    by_last = {k.rsplit(".", 1)[-1]: k for k in keys}
    hit = difflib.get_close_matches(last, list(by_last), n=1, cutoff=0.6)
    return by_last[hit[0]] if hit else None


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message says how to fix it."""


def check_key(key: str) -> None:
    """Raise ConfigError when ``key`` (a dotted path, maybe ``+``/``++``/``~`` prefixed) is not in the schema.

    A key of a verl feature vlmrl does not implement (``UNSUPPORTED``) gets the reason; any other unknown key gets
    the nearest valid key.
    """
    key = key.lstrip("+~")
    if key.startswith("hydra.") or key == "hydra":
        return
    if any(key == d or key.startswith(d + ".") for d in _OPEN_DICTS):
        return
    valid = _leaf_keys(VLMRLConfig, "")
    if key in valid:
        return
    # a group node (e.g. actor_rollout_ref.actor.optim) given a whole dict is fine too
    if any(v.startswith(key + ".") for v in valid):
        return
    for bad in sorted(UNSUPPORTED, key=len, reverse=True):
        if key == bad or key.startswith(bad + "."):
            raise ConfigError(f"'{key}': {UNSUPPORTED[bad]}.")
    near = nearest_key(key)
    hint = f" Did you mean '{near}'?" if near else ""
    raise ConfigError(f"Unknown config key '{key}'.{hint} (valid keys: python -m vlmrl.train --help)")


def validate_overrides(overrides: list[str]) -> None:
    """Check every ``key=value`` command-line override against the schema before anything starts."""
    for ov in overrides:
        if "=" not in ov or ov.startswith("-"):
            continue
        check_key(ov.split("=", 1)[0])


def normalize_overrides(overrides: list[str]) -> list[str]:
    """Let a plain ``key=value`` set a new key below a dict-typed field (``actor_rollout_ref.rollout.engine_kwargs``,
    ``custom_reward_function.reward_kwargs``, ``reward.dispatch``): it becomes Hydra's ``++key=value``.

    verl's own config lists some of these keys (e.g. ``engine_kwargs.vllm.disable_mm_preprocessor_cache``), so verl
    launch lines set them with or without ``+``; both work here.
    """
    out = []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        if "=" in ov and not ov.startswith(("+", "~", "-")) and any(key.startswith(d + ".") for d in _OPEN_DICTS):
            ov = "++" + ov
        out.append(ov)
    return out


def reject_unsupported_values(cfg: VLMRLConfig) -> None:
    """Raise ConfigError, with the reason, for each schema key set to a value vlmrl does not implement
    (``UNSUPPORTED_VALUES``: e.g. ``actor_rollout_ref.rollout.multi_turn.enable=True``, ``strategy=megatron``)."""
    problems = []
    for key, (accepted, why) in UNSUPPORTED_VALUES.items():
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value not in accepted:
            ok = " | ".join(repr(a) if isinstance(a, str) else str(a) for a in accepted)
            problems.append(f"{key}={value!r}: {why}; accepted: {ok}.")
    gen, bs = cfg.data.gen_batch_size, cfg.data.train_batch_size
    if gen is not None and gen != bs:
        problems.append(
            f"data.gen_batch_size={gen}: vlmrl rolls out data.train_batch_size={bs} prompts per batch (also with "
            f"algorithm.filter_groups; max_num_gen_batches bounds the extra batches); unset it or set it to {bs}."
        )
    if problems:
        raise ConfigError("\n".join(problems))


def to_object(cfg: DictConfig) -> VLMRLConfig:
    """Resolve interpolations and turn a DictConfig into the typed VLMRLConfig.

    Raises ConfigError when a mandatory key is unset (saying how to set it) or a key has a value vlmrl does not
    implement (``reject_unsupported_values``).
    """
    merged = OmegaConf.merge(OmegaConf.structured(VLMRLConfig), cfg)
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        what = "".join(f"\n  {k}: {_REQUIRED_HINTS.get(k, f'set it, e.g. {k}=...')}" for k in missing)
        raise ConfigError(f"Required setting(s) not given:{what}")
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, VLMRLConfig)
    reject_unsupported_values(obj)
    return obj


def load(overrides: list[str] | None = None, config_name: str = "grpo") -> VLMRLConfig:
    """Compose ``configs/<config_name>.yaml`` with overrides (as the CLI would) and return the typed config."""
    from hydra import compose, initialize_config_dir

    from vlmrl import configs_dir

    overrides = normalize_overrides(list(overrides or []))
    validate_overrides(overrides)
    register()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return to_object(cfg)
