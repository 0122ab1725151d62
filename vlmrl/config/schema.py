"""The config schema: typed dataclasses, one docstring per field (every key vlmrl implements, and nothing else).

Key paths follow verl's (``data.train_files``, ``actor_rollout_ref.rollout.n``, ``trainer.logger`` ...). verl keys
that vlmrl only accepts for compatibility (aliases, speed switches it has no use for, features it refuses) are not
here: they live in ``vlmrl.config.verl``'s table. Defaults follow verl's where a verl user relies on them; the README
("Coming from verl") lists the few that differ and why. String options take the values in ``CHOICES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from vlmrl.algorithms.loss_settings import AGG_MODES, PolicyLossConfig  # noqa: F401 (re-exported)
from vlmrl.config.reward_model import RewardModelConfig
from vlmrl.config.schema_parts import (  # noqa: F401 (re-exported)
    AsyncTrainingConfig,
    FSDPConfig,
    OptimConfig,
    RolloutPoolConfig,
    WrapPolicyConfig,
)
from vlmrl.config.schema_ppo import CriticConfig, KLCtrlConfig

# ----------------------------------------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    train_files: Any = MISSING
    """Parquet file or list of files for training (verl's record schema)."""
    val_files: Any = None
    """Parquet file or list of files for validation; None disables validation."""
    prompt_key: str = "prompt"
    """Column holding the chat list ``[{role, content}]`` with one ``<image>`` per image (``<video>`` per video)."""
    image_key: str = "images"
    """Column holding the list of ``{bytes, path}`` image structs."""
    video_key: str = "videos"
    """Column holding the list of videos (one per ``<video>`` in the prompt): ``{frames: [{bytes, path}], ...}``
    structs as ``preprocess/`` writes them, or verl's ``{video: path, fps, ...}``."""
    max_prompt_length: int = 512
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
    video_min_pixels: int | None = None
    """Smallest video frame area after resizing; None = the video processor's value."""
    video_max_pixels: int | None = None
    """Largest video frame area after resizing; None = the video processor's value."""
    video_total_pixels: int | None = None
    """Pixel budget of one video, shared by its frames (qwen-vl-utils' ``total_pixels``: each frame gets at most
    ``2 x total / frames``); None = qwen-vl-utils' default (90% of 128000 tokens' worth)."""
    video_fps: float = 2.0
    """Frames sampled per second from a video file no preprocessing sampled (verl's ``{video: path}`` entries
    without their own ``fps``/``nframes``); preprocessed videos keep the frames they recorded."""
    video_min_frames: int = 4
    """Fewest frames sampled from such a file (qwen-vl-utils' ``min_frames``)."""
    video_max_frames: int = 768
    """Most frames sampled from such a file (qwen-vl-utils' ``max_frames``)."""
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
    train_max_samples: int = -1
    """Use at most this many training records (the first ones, before the overlong filter); -1 = all."""
    val_max_samples: int = -1
    """Use at most this many validation records; -1 = all."""


# ---------------------------------------------------------------------------------------------- actor/rollout/ref


@dataclass
class ModelConfig:
    path: str = MISSING
    """HF folder or hub id of a Qwen-VL checkpoint (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE: models.families)."""
    trust_remote_code: bool = False
    """Passed to transformers' and vLLM's loaders. Only ever from the launch command: never read from a checkpoint."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (less memory, ~30% more compute; verl's default)."""
    use_remove_padding: bool = False
    """Padding-free forwards for the actor and the reference (verl's key; its scripts set it): each micro-batch runs
    as one packed row of real tokens, every distinct prompt once (``vlmrl.models.packing``). Same values and
    gradients as off, where each micro-batch runs padded to its longest prompt and response."""
    freeze_vision_tower: bool = False
    """Keep the vision tower's weights fixed (it still runs, and is still pushed once to the engine). verl's
    ``actor_rollout_ref.actor.freeze_vision_tower`` sets this too."""
    lora_rank: int = 0
    """LoRA rank on the language model's linear layers (0 = full fine-tuning)."""
    lora_alpha: int = 16
    """LoRA alpha."""
    target_modules: Any = "all-linear"
    """LoRA target modules (peft syntax): all-linear, a comma list or list of names."""
    exclude_modules: str | None = None
    """Modules LoRA leaves out, as verl's regex over module names. The vision tower is always left out (verl's
    scripts pass ``.*visual.*``, which is accepted); any other pattern is applied on top (peft's exclude_modules)."""


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
    """Size micro-batches by tokens instead of samples (verl's key): as few as hold the samples within
    ppo_max_token_len_per_gpu tokens each, with balanced token sums (``workers.micro_batches``). Loss and gradients
    are the fixed-size run's; ppo_micro_batch_size_per_gpu is then unused."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget per update micro-batch with use_dynamic_bsz (prompt with its image tokens + response, per
    sample)."""
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
    """token-mean | token-sum | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (verl's)."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """The policy loss (``policy_loss.loss_mode``) and its settings."""
    tau_pos: float = 1.0
    """SAPO: the gate's temperature for positive advantages."""
    tau_neg: float = 1.05
    """SAPO: the gate's temperature for negative advantages."""
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
    log_prob_use_dynamic_bsz: bool | None = None
    """Token-budget micro-batches for the reference forward; None = actor.use_dynamic_bsz (verl's default)."""
    log_prob_max_token_len_per_gpu: int | None = None
    """Token budget per reference micro-batch; None = actor.ppo_max_token_len_per_gpu (verl's default)."""
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
    """verl's ``actor_rollout_ref.rollout.multi_turn``: the policy calls tools over several turns (hermes format).
    The whole trajectory (policy and tool tokens) fits in ``data.max_response_length``, as in verl; the loss covers
    the policy's tokens only."""

    enable: bool = False
    """Multi-turn tool rollouts on."""
    max_assistant_turns: int | None = None
    """Policy turns per trajectory; None = until the token budget."""
    max_user_turns: int | None = None
    """Tool turns per trajectory; None = until the token budget."""
    tool_config_path: str | None = None
    """verl's tool YAML (``tools: [{class_name, config, tool_schema}]``)."""
    format: str = "hermes"
    """Tool-call format: hermes (``<tool_call>{json}</tool_call>``, Qwen2.5's)."""
    max_parallel_calls: int = 1
    """Tool calls run per turn (extra calls in one turn are ignored and counted)."""
    max_tool_response_length: int = 256
    """Characters of a tool's text the policy reads; longer text is truncated."""
    tool_response_truncate_side: str = "middle"
    """Where long tool text is cut: left (keep the start) | right (keep the end) | middle."""
    max_tokens_per_turn: int | None = None
    """Tokens one policy turn may generate; None = what is left of the trajectory's budget."""
    max_tool_images: int = 4
    """Images tools may add to one trajectory (the engine reserves room for them per request); a call that would add
    more gets an error as its result."""
    tool_timeout_s: float = 30.0
    """Seconds a tool call may take; past it its worker process is ended, the policy reads a timeout error and the
    call is counted. A rollout whose first 2 x tool_workers calls all time out stops the run (the tool hangs)."""
    tool_workers: int = 2
    """Processes per rollout worker that run tool calls, one call each at a time (a timeout ends the process; more
    for tools that wait on I/O). 0 = in the rollout worker's own thread, one after another (debugging; nothing can
    stop a call there, so tool_timeout_s must be 0)."""
    schedule: str = "trajectory"
    """trajectory: each trajectory's next turn starts as soon as its tool calls return (verl's agent loop; on the
    vLLM engine with tool_workers >= 1 and one rank per engine, else turn by turn, which the dry run's plan names) |
    turn: every trajectory's turn k generates together, then all of turn k's calls run, then turn k + 1."""


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
    """Workers that share one vLLM engine, each holding 1/k of it (tensor parallelism)."""
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
    log_prob_use_dynamic_bsz: bool | None = None
    """Token-budget micro-batches for the old-log-prob forward; None = actor.use_dynamic_bsz (verl's default)."""
    log_prob_max_token_len_per_gpu: int | None = None
    """Token budget per old-log-prob micro-batch; None = actor.ppo_max_token_len_per_gpu (verl's default)."""
    load_format: str = "auto"
    """How the engine reads the checkpoint at start: auto | safetensors | pt. verl's dummy (random weights, the
    trainer's pushed in later) is refused: vLLM's dummy load also randomises persistent buffers that no weight push
    restores (Qwen2.5-VL's ``visual.input_norm``, the attention scales), so the engine would never match the policy."""
    limit_images: int | None = None
    """Max images per prompt for the engine; None = read from the data."""
    limit_videos: int | None = None
    """Max videos per prompt for the engine; None = read from the data (0 when it has none)."""
    ignore_eos: bool = False
    """Always generate max_tokens (benchmarks)."""
    seed: int = 0
    """Sampling seed (per worker: seed + rank)."""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}})
    """Extra engine arguments: ``engine_kwargs.vllm.<arg>`` pass to ``vllm.LLM``; unknown ones are an error. verl's
    rollout keys that are vLLM settings (``max_num_seqs``, ``enable_prefix_caching``...) arrive here."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """True: policy, reference and rollout engine share every worker (generate, then train). False: verl's one-step
    off-policy trainer: a rollout pool of its own (``rollout.*``) generates the next batch while the training pool
    updates on this one; weights are synced through a collective each step (``async_training.*``)."""
    nccl_timeout: int = 600
    """Seconds a collective (gloo on CPU, NCCL on GPU) may wait for the other workers before it fails."""
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


# ------------------------------------------------------------------------------------------------ algorithm/reward


TOTAL_SCORE_NAMES = ("score", "reward", "seq_reward", "seq_final_reward", "acc")
"""Names ``algorithm.filter_groups.metric`` takes for the total reward (verl's spellings), unless a component has
one of them."""


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    """DAPO dynamic sampling: drop groups whose rewards all equal, and roll out more prompts to refill."""
    metric: str = "score"
    """Reward component whose variance decides (score = the total; also spelled as in ``TOTAL_SCORE_NAMES``)."""
    max_num_gen_batches: int = 4
    """Most rollout batches per step before training on what was kept (0 = unbounded, verl's default: a reward
    that never varies would then roll out forever)."""


@dataclass
class RolloutCorrectionConfig:
    """``algorithm.rollout_correction``: correct the loss for the engine's sampling policy differing from the
    trainer's (``vlmrl.algorithms.rollout_correction``; verl's keys and defaults). Off unless rollout_is or rollout_rs
    is set."""

    rollout_is: str | None = None
    """Importance weights pi_old / pi_engine: token | sequence (None: none)."""
    rollout_is_threshold: Any = 2.0
    """A number (truncate the weights at it, TIS) or "lower_upper" (zero them outside, IcePop)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their mean over the batch (every worker's tokens or sequences)."""
    rollout_rs: str | None = None
    """Rejection: comma-separated token_k1 | token_k2 | token_k3 | seq_{sum,mean}_k{1,2,3} | seq_max_k{2,3}
    (None: none); rejected tokens or sequences leave the loss's mask."""
    rollout_rs_threshold: Any = None
    """Bounds of each rollout_rs option (k1: "lower_upper" ratio bounds or one upper; k2/k3: an upper bound), one
    shared or one per option, comma-separated."""
    bypass_mode: bool = False
    """verl's bypass mode: the engine's log-probs are the old ones (no recomputation), the weights and rejection are
    computed against the current policy inside the loss (``actor.policy_loss.loss_mode`` becomes bypass_mode)."""
    loss_type: str = "ppo_clip"
    """Bypass mode's loss: ppo_clip (PPO clip on the kept tokens) | reinforce (REINFORCE with the weights)."""

    @property
    def enabled(self) -> bool:
        """Whether any correction applies (bypass mode is one)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """grpo | grpo_vectorized | dr_grpo | rloo | rloo_vectorized | opo | gpg | grpo_passk | reinforce_plus_plus |
    reinforce_plus_plus_baseline | gdpo | remax | gae (PPO with a critic: verl's default, vlmrl's quick start uses grpo)
    (``vlmrl.algorithms.estimators``), a name a user's file registers, or ``path/to/file.py:fn``."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's std (False = Dr. GRPO)."""
    gamma: float = 1.0
    """Discount of token-level rewards (GAE, REINFORCE++)."""
    name: str | None = None
    """An algorithm class of your own (``vlmrl.algorithms.RLAlgorithm``): ``module.Class`` importable from the working
    directory, or ``path/to/file.py:Class``. Keys under ``algorithm`` the schema does not know become its
    constructor's arguments (``params``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The class's constructor arguments: filled from the unknown keys under ``algorithm`` (``+algorithm.x=1``)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights and rejection against the engine's own log-probs (off by default)."""
    plugins: list[str] = field(default_factory=list)
    """Python files (``path/to/my_algos.py``) or modules importable from the working directory, imported by the
    driver and every worker first: their ``@register_adv_est`` / ``@register_policy_loss`` decorators (vlmrl's,
    ``vlmrl.algorithms``, or verl's own) add names that ``adv_estimator`` and ``actor.policy_loss.loss_mode`` can
    use."""
    gdpo_reward_keys: list[str] | None = None
    """GDPO: the reward components each normalised within its group on its own (names of ``reward.components`` or
    keys of a reward function's dict); None = the total only."""
    gdpo_reward_weights: list[float] | None = None
    """GDPO: a weight per key of gdpo_reward_keys (None = 1 each)."""
    lam: float = 1.0
    """GAE's lambda."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl's coefficient x KL(policy || reference) from each generated token's reward (builds the
    reference model), for every estimator."""
    kl_penalty: str = "kl"
    """The in-reward KL estimator: kl (k1) | abs | mse (k2) | low_var_kl (k3)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """The in-reward KL coefficient: fixed or adaptive (verl's controllers)."""
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
    ``vlmrl.scoring.registered_names()``), ``path/to/file.py:fn`` or ``package.module:fn``; used when
    custom_reward_function.path and components are unset. All unset: built-in dispatch by data_source (geo3k,
    hiyouga/geometry3k -> geo3k; synthetic/* -> synthetic)."""
    components: list[Any] = field(default_factory=list)
    """Composite reward: list of ``{function, weight=1, kwargs={}, gate=None, gate_threshold=0.5, name}``; total =
    sum of weight * value over components whose gate component scored >= gate_threshold."""
    dispatch: dict[str, Any] = field(default_factory=dict)
    """Per-data_source rewards for mixed datasets: ``{data_source or glob: name | {function, kwargs} |
    {components}}``; sources not listed use the selection above."""
    num_workers: int = 1
    """Reward worker processes: a call still running after timeout_s is stopped by ending its worker (replaced at
    once). 0 = score in the driver's own thread (debugging; no timeout can stop a blocked call there, so timeout_s
    must be 0). verl's reward.num_workers has the same meaning."""
    timeout_s: float = 30.0
    """Per-sample timeout in seconds (0 = none; only allowed, and then required, with num_workers=0)."""
    on_error: str = "fallback"
    """An exception, timeout, NaN/inf or non-number result: fallback (score it fallback_score, count it in
    reward/errors, log the first of each kind with the sample) | raise (fail the step, naming the sample)."""
    fallback_score: float = 0.0
    """Score given to a sample whose reward failed."""
    max_failed_ratio: float = 1.0
    """Stop the run, with the first error and its traceback, when at least this fraction of a batch's reward calls
    fail (1.0: only when every one failed, e.g. a reward whose signature or import is wrong for this data)."""


# --------------------------------------------------------------------------------------------------------- trainer


@dataclass
class PrometheusConfig:
    """``trainer.logger`` with ``prometheus``: the step's metrics as gauges at http://host:port/metrics."""

    host: str = "127.0.0.1"
    """Address the exporter listens on; anything but loopback needs token_file."""
    port: int = 9464
    """Port (0: any free port; the address is printed at start-up)."""
    token_file: str | None = None
    """A file holding a secret: scrapers must send ``Authorization: Bearer <secret>`` (required off loopback)."""


@dataclass
class TrainerConfig:
    project_name: str = "vlmrl"
    """Tracking project name."""
    experiment_name: str = "run"
    """Tracking run name."""
    logger: Any = field(default_factory=lambda: ["console", "jsonl"])
    """A list of console, jsonl, tensorboard, wandb, prometheus (or one name, as verl scripts write
    ``trainer.logger=console``)."""
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    """The exporter of ``trainer.logger=[..., prometheus]``."""
    device: str = "auto"
    """auto (cuda when available) | cuda | cpu."""
    nnodes: int = 1
    """Machines the run trains on (more than 1: a Ray cluster, trainer.ray_address). Workers = nnodes x
    n_gpus_per_node on GPUs, nnodes x cpu_workers on CPUs; the workers of one node stay on one machine."""
    n_gpus_per_node: int = 1
    """GPUs per machine (one hybrid worker each)."""
    cpu_workers: int = 2
    """Hybrid workers per machine when training on CPU."""
    total_epochs: int = 30
    """Epochs over the training set (verl's default)."""
    total_training_steps: int | None = None
    """Cap on training steps (overrides total_epochs)."""
    seed: int = 1
    """Seed of model-side randomness (sampling, dropout)."""
    critic_warmup: int = 0
    """Steps that train only the critic before the actor starts updating (PPO with a critic)."""
    save_freq: int = -1
    """Checkpoint every N steps (-1 = never, except at the end if > 0)."""
    max_actor_ckpt_to_keep: int | None = None
    """Keep only the newest N checkpoints (None = all); ``trainer.max_ckpt_to_keep`` sets it too."""
    resume_mode: str = "auto"
    """auto (latest in default_local_dir) | disable | resume_path."""
    resume_from_path: str | None = None
    """Checkpoint folder for resume_mode=resume_path."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoints, metrics.jsonl and plots go here."""
    test_freq: int = -1
    """Validate every N steps (-1 = only at the end when val_files is set)."""
    val_before_train: bool = True
    """Validate before the first step (verl's default)."""
    val_only: bool = False
    """Only validate (a checkpoint or the initial model), then exit."""
    log_val_generations: int = 16
    """Validation samples shown in the HTML gallery written at each validation (0 = no gallery)."""
    rollout_data_dir: str | None = None
    """Dump every step's samples (prompt, response, rewards) as JSON lines here."""
    validation_data_dir: str | None = None
    """Dump every validation's samples (prompt, response, rewards) as JSON lines here."""
    ray_address: str | None = None
    """Ray cluster to run on (``auto`` = the cluster this machine joined with ``ray start``; ``host:port``); None =
    no cluster (trainer.launcher=auto then starts local worker processes)."""
    launcher: str = "auto"
    """How workers start: local (one process per worker on this machine; nothing listens on the network) | ray
    (Ray actors: clusters; token authentication on) | inline (one worker in the driver's process: debugging) | auto
    (ray when trainer.ray_address or RAY_ADDRESS is set, else local)."""
    worker_timeout_s: float = 1800.0
    """A worker call (rollout, update, checkpoint, ...) not answered within this many seconds stops the run, naming
    the worker and the stage (a frozen process, a collective that waits forever)."""
    worker_startup_timeout_s: float = 3600.0
    """The same bound for the workers' start-up (imports, model load, engine start): apart from worker_timeout_s, so
    a short bound that catches a frozen step does not stop a start-up that is slow (a large model, a busy machine)."""
    dry_run: bool = False
    """Check everything that needs no hardware (keys and values, data files, model folder, reward function), print
    the plan and exit: 0 when the run would start, 2 listing every problem."""


@dataclass
class VLMRLConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)


# ------------------------------------------------------------------------------------------------------ choices

CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right"),
    "actor_rollout_ref.actor.strategy": ("fsdp", "fsdp2"),
    "actor_rollout_ref.ref.strategy": ("fsdp", "fsdp2"),
    "actor_rollout_ref.actor.loss_agg_mode": AGG_MODES,
    "actor_rollout_ref.actor.kl_loss_type": ("kl", "k1", "k2", "mse", "low_var_kl", "k3", "abs"),
    "algorithm.kl_penalty": ("kl", "k1", "k2", "mse", "low_var_kl", "k3", "abs"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "critic.strategy": ("fsdp", "fsdp2"),
    "critic.loss_agg_mode": ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
    "critic.optim.warmup_style": ("constant", "cosine"),
    "critic.fsdp.dtype": ("auto", "bfloat16", "float16", "float32"),
    "actor_rollout_ref.actor.optim.warmup_style": ("constant", "cosine"),
    "actor_rollout_ref.actor.fsdp_config.dtype": ("auto", "bfloat16", "float16", "float32"),
    "actor_rollout_ref.ref.fsdp_config.dtype": ("auto", "bfloat16", "float16", "float32"),
    "actor_rollout_ref.rollout.name": ("vllm", "hf"),
    "actor_rollout_ref.rollout.dtype": ("auto", "float32", "bfloat16", "float16"),
    "actor_rollout_ref.rollout.load_format": ("auto", "safetensors", "pt"),
    "actor_rollout_ref.rollout.multi_turn.format": ("hermes",),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "right", "middle"),
    "actor_rollout_ref.rollout.multi_turn.schedule": ("trajectory", "turn"),
    "trainer.device": ("auto", "cuda", "cpu"),
    "reward_model.style": ("discriminative", "generative"),
    "reward_model.rollout.name": ("vllm", "hf"),
    "reward_model.model.fsdp_config.dtype": ("auto", "bfloat16", "float16", "float32"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.launcher": ("auto", "local", "ray", "inline"),
    "async_training.mode": ("one_step_off_policy", "fully_async"),
}
"""Every string option with a closed set of values (a bad value fails when the config is composed). Options that
also take a file (``adv_estimator``, ``policy_loss``, reward names) are checked by their loaders at the same time."""

NULLABLE_CHOICES = frozenset({"critic.loss_agg_mode"})
"""Choices where None is allowed too (None: the actor's value)."""

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "prometheus")
"""Values of ``trainer.logger``."""
