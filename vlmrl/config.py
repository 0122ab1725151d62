"""The config schema: typed dataclasses, one docstring per field, registered with Hydra's ConfigStore.

Key paths follow verl's (``data.train_files``, ``actor_rollout_ref.rollout.n``, ``trainer.logger`` ...) so a verl
launch line runs unchanged. This module is the single place that says which keys exist; ``validate_overrides``
rejects an unknown key before any expensive start-up and names the nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
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


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    ppo_mini_batch_size: int = 16
    """Prompts per optimizer step (x rollout.n samples), as in verl."""
    ppo_micro_batch_size_per_gpu: int = 8
    """Samples per forward/backward pass on one worker."""
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
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per reference forward; None = actor.ppo_micro_batch_size_per_gpu."""
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
class RolloutConfig:
    name: str = "vllm"
    """Rollout engine: vllm | hf."""
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
    """vLLM tensor parallel size."""
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
    limit_images: int | None = None
    """Max images per prompt for the engine; None = read from the data."""
    ignore_eos: bool = False
    """Always generate max_tokens (benchmarks)."""
    seed: int = 0
    """Sampling seed (per worker: seed + rank)."""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}})
    """Extra engine arguments: ``engine_kwargs.vllm.<arg>`` pass to ``vllm.LLM``; unknown ones are an error."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


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
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """grpo | dr_grpo | rloo | reinforce_plus_plus, or ``path/to/file.py:fn``."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (False = Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """verl's in-reward KL penalty; not supported (use actor.use_kl_loss), True is rejected."""
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
    """Keep only the newest N checkpoints."""
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
    rollout_data_dir: str | None = None
    """Dump every step's samples (prompt, response, rewards) as JSON lines here."""
    critic_warmup: int = 0
    """verl compatibility: GRPO has no critic, only 0 is accepted."""
    ray_address: str | None = None
    """Ray cluster address (None = start or join a local one; ``auto`` = the running cluster)."""


@dataclass
class VLMRLConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# --------------------------------------------------------------------------------------------------------- helpers

# keys of verl that name features vlmrl does not implement: an override naming them gets this message
UNSUPPORTED: dict[str, str] = {
    "actor_rollout_ref.actor.strategy": "vlmrl trains with FSDP2 only (Megatron is not supported)",
    "critic": "GRPO-family estimators need no critic; vlmrl has none",
    "reward_model.enable": "model-based reward models are not supported; use a reward function",
    "actor_rollout_ref.actor.megatron": "Megatron is not supported; vlmrl trains with FSDP2",
    "actor_rollout_ref.ref.megatron": "Megatron is not supported; vlmrl trains with FSDP2",
}

# dict-typed fields: any key below them is valid (passed through and checked by their consumer)
_OPEN_DICTS = ("actor_rollout_ref.rollout.engine_kwargs", "custom_reward_function.reward_kwargs", "reward.dispatch")


def register() -> None:
    """Register the schema with Hydra's ConfigStore as ``vlmrl_schema``."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="vlmrl_schema", node=VLMRLConfig)


def leaf_keys(cls: type = VLMRLConfig, prefix: str = "") -> list[str]:
    """All dotted leaf key paths of a config dataclass."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = _dataclass_type(cls, f)
        if sub is not None:
            out.extend(leaf_keys(sub, key + "."))
        else:
            out.append(key)
    return out


def _dataclass_type(cls: type, f: dataclasses.Field) -> type | None:
    import typing

    hints = typing.get_type_hints(cls)
    t = hints.get(f.name)
    return t if dataclasses.is_dataclass(t) else None


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
    """Raise ConfigError when ``key`` (a dotted path, maybe ``+``/``++``/``~`` prefixed) is not in the schema."""
    key = key.lstrip("+~")
    if key.startswith("hydra.") or key == "hydra":
        return
    for bad, why in UNSUPPORTED.items():
        if key == bad or key.startswith(bad + "."):
            raise ConfigError(f"'{key}': {why}.")
    if any(key == d or key.startswith(d + ".") for d in _OPEN_DICTS):
        return
    valid = set(leaf_keys())
    if key in valid:
        return
    # a group node (e.g. actor_rollout_ref.actor.optim) given a whole dict is fine too
    if any(v.startswith(key + ".") for v in valid):
        return
    near = nearest_key(key)
    hint = f" Did you mean '{near}'?" if near else ""
    raise ConfigError(f"Unknown config key '{key}'.{hint} (valid keys: python -m vlmrl.train --help)")


def validate_overrides(overrides: list[str]) -> None:
    """Check every ``key=value`` command-line override against the schema before anything starts."""
    for ov in overrides:
        if "=" not in ov or ov.startswith("-"):
            continue
        check_key(ov.split("=", 1)[0])


def to_object(cfg: DictConfig) -> VLMRLConfig:
    """Resolve interpolations and turn a DictConfig into the typed VLMRLConfig."""
    merged = OmegaConf.merge(OmegaConf.structured(VLMRLConfig), cfg)
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, VLMRLConfig)
    return obj


def load(overrides: list[str] | None = None, config_name: str = "grpo") -> VLMRLConfig:
    """Compose ``configs/<config_name>.yaml`` with overrides (as the CLI would) and return the typed config."""
    from hydra import compose, initialize_config_dir

    from vlmrl import configs_dir

    overrides = list(overrides or [])
    validate_overrides(overrides)
    register()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=overrides)
    return to_object(cfg)
