"""The table behind ``vlmrl.config.verl``: how each verl key that is not vlmrl's own is answered (``RULES``, first
match wins) and which values of vlmrl's own keys name verl features vlmrl does not implement (``VALUE_REASONS``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALIAS, NOTICE, ACCEPT, FEATURE = "alias", "notice", "accept", "feature"
DROP = object()
"""An alias value map entry meaning: the override has no effect (vlmrl already behaves so), drop it."""

_MEGATRON = "the Megatron-LM backend (vlmrl trains with PyTorch FSDP2)"
_EXPERT_PARALLEL = (
    "expert parallelism for mixture-of-experts models (vlmrl's FSDP2 shards experts like any weight: "
    "Qwen3-VL-MoE trains with every expert on every rank)"
)
_ROUTING_REPLAY = "MoE routing replay (the trainer's forward routes tokens itself)"
_CRITIC_LORA = "LoRA on the critic (it trains fully; actor LoRA: actor_rollout_ref.model.lora_rank)"
_PROFILER = "verl's profiler (nsys / torch / NPU profiling); vlmrl logs per-stage timings in metrics.jsonl"
_FUNCTION_TOOLS = "tools from plain Python functions (declare tool classes in multi_turn.tool_config_path)"


@dataclass(frozen=True)
class Rule:
    """How one verl key (an fnmatch pattern over the dotted path; ``*`` crosses dots) is answered."""

    pattern: str
    kind: str
    why: str = ""
    """notice: what vlmrl does instead; accept / feature: the feature; alias: an optional note."""
    target: str | None = None
    """alias: the vlmrl key that takes the value."""
    values: tuple[Any, ...] = ()
    """accept: the values accepted (vlmrl behaves so)."""
    mapping: dict[Any, Any] | None = None
    """alias: value translation (a value missing from the map is refused); ``DROP`` = accepted with no effect."""


def alias(pattern: str, target: str, mapping: dict[Any, Any] | None = None, why: str = "") -> Rule:
    """Rewrite ``pattern`` to ``target`` (with a value map when the two spell values differently)."""
    return Rule(pattern, ALIAS, why, target=target, mapping=mapping)


def notice(pattern: str, why: str) -> Rule:
    """Accept any value with one printed notice saying what vlmrl does instead."""
    return Rule(pattern, NOTICE, why)


def accept(pattern: str, values: tuple[Any, ...], why: str) -> Rule:
    """Accept these values (what vlmrl does); refuse others naming the feature ``why``."""
    return Rule(pattern, ACCEPT, why, values=values)


def feature(pattern: str, why: str) -> Rule:
    """Refuse, naming the feature ``why``."""
    return Rule(pattern, FEATURE, why)


def _engine(name: str) -> Rule:
    return alias(
        f"actor_rollout_ref.rollout.{name}",
        f"actor_rollout_ref.rollout.engine_kwargs.vllm.{name}",
        why="a vLLM engine setting",
    )


FSDP_GROUPS = ("*.fsdp_config", "critic.fsdp")
"""Where verl keeps FSDP settings: each model's ``fsdp_config``, the critic's ``fsdp`` (verl 0.9.1)."""


def _fsdp_notices(group: str) -> tuple[Rule, ...]:
    """FSDP speed settings FSDP2 covers by itself, under ``group``."""
    return (
        notice(f"{group}.forward_prefetch", "FSDP2 prefetches by default"),
        notice(f"{group}.use_orig_params", "FSDP2 always keeps the original parameters"),
        notice(f"{group}.use_no_sync_for_gradient_accumulation", "FSDP2 reduce-scatters per micro-batch"),
        notice(f"{group}.seed", "model-side randomness uses trainer.seed"),
    )


def _fsdp_accepts(group: str) -> tuple[Rule, ...]:
    """FSDP settings accepted at the value vlmrl behaves as, under ``group``."""
    return (
        accept(f"{group}.strategy", ("fsdp", "fsdp2"), _MEGATRON),
        accept(f"{group}.model_dtype", ("fp32", "float32"), "master weights in another dtype (vlmrl keeps fp32)"),
        accept(f"{group}.full_determinism", (False,), "deterministic kernels"),
    )


def _trained_model(prefix: str) -> tuple[Rule, ...]:
    """The loss-scale, checkpoint and optimizer keys of a trained model (the actor, the critic) under ``prefix``."""
    return (
        accept(f"{prefix}.loss_scale_factor", (None,), "a constant loss scale"),
        accept(f"{prefix}.checkpoint.async_save", (False,), "asynchronous checkpoint saving"),
        accept(
            f"{prefix}.checkpoint.*_contents",
            (["model", "optimizer", "extra"],),
            "choosing checkpoint contents (vlmrl saves model, optimizer and extra state)",
        ),
        accept(f"{prefix}.optim.optimizer", ("AdamW", "adamw"), "other optimizers (vlmrl uses AdamW)"),
        accept(f"{prefix}.optim.optimizer_impl", ("torch.optim",), "other optimizer implementations"),
        accept(
            f"{prefix}.optim.total_training_steps",
            (-1,),
            "a separate step count for the schedule (it follows trainer.total_training_steps)",
        ),
        accept(f"{prefix}.optim.num_cycles", (0.5,), "cosine schedules with other cycle counts"),
        accept(f"{prefix}.optim.override_optimizer_config", (None, {}), "optimizer overrides"),
        feature(f"{prefix}.optim.*", "Megatron optimizer settings"),
    )


_JUDGE_KEYS = (
    "name",
    "temperature",
    "top_p",
    "top_k",
    "response_length",
    "prompt_length",
    "max_model_len",
    "gpu_memory_utilization",
)
_RM_POOL = "a reward model in a resource pool of its own (vlmrl: the discriminative model on the training workers, "
_RM_POOL += "the judge's engine in the driver)"


def _reward_model_rules() -> tuple[Rule, ...]:
    """verl's reward-model keys: verl 0.9.1's (``reward.reward_model.*``, and ``reward_model.*`` which it migrates
    there) and the older FSDP reward-model worker's (``reward_model.micro_batch_size_per_gpu``, ...)."""
    rules: list[Rule] = [
        alias("reward.reward_model.enable", "reward_model.enable"),
        alias("reward.reward_model.model_path", "reward_model.model.path"),
        alias("reward_model.num_workers", "reward.num_workers", why="verl 0.9.1 moves it there too"),
        *(alias(f"reward.reward_model.rollout.{k}", f"reward_model.rollout.{k}") for k in _JUDGE_KEYS),
        alias(
            "*reward_model.rollout.do_sample",
            "reward_model.rollout.temperature",
            mapping={False: 0.0, True: DROP},
            why="greedy verdicts are temperature 0",
        ),
        accept("*reward_model.enable_resource_pool", (False,), _RM_POOL),
        notice("*reward_model.n_gpus_per_node", "the reward model uses the run's devices (no pool of its own)"),
        notice("*reward_model.nnodes", "the reward model uses the run's devices (no pool of its own)"),
        accept("reward_model.model.external_lib", (None,), "importing an external library for the reward model"),
        accept("reward_model.reward_loop_source", ("register", None), "custom reward loops"),
        accept("reward_model.reward_loop_module_path", (None,), "custom reward loops"),
        accept("reward_model.reward_loop_class_name", (None,), "custom reward loops"),
        accept("reward_model.strategy", ("fsdp", "fsdp2"), _MEGATRON),
        accept("reward_model.use_dynamic_bsz", (False,), "token-budget micro-batches for the reward model"),
        notice("reward_model.forward_max_token_len_per_gpu", "the reward model runs fixed micro-batches"),
        accept("reward_model.ulysses_sequence_parallel_size", (1,), "sequence parallelism"),
        notice("reward_model.launch_reward_fn_async", "rewards are scored while nothing else runs on the driver"),
        notice("reward_model.micro_batch_size", "verl's global micro-batch size: set micro_batch_size_per_gpu"),
        notice("reward_model.model.use_remove_padding", "the reward model's forward runs padded micro-batches"),
        notice("reward_model.model.use_fused_kernels", "the reward model runs vlmrl's own forward"),
        accept("*reward_model.rollout.n", (1,), "several verdicts per response"),
        notice("*reward_model.rollout.tensor_model_parallel_size", "the judge's engine runs on one device"),
        accept("*reward_model.rollout.data_parallel_size", (1,), "several judge engines"),
        accept("*reward_model.rollout.expert_parallel_size", (1,), "expert parallelism"),
        accept("*reward_model.rollout.pipeline_model_parallel_size", (1,), "pipeline parallelism"),
        accept("*reward_model.rollout.load_format", ("auto",), "other weight formats for the judge"),
        accept("*reward_model.rollout.engine_kwargs", ({},), "engine arguments for the judge"),
        accept("*reward_model.rollout.quantization*", (None,), "a quantised judge"),
        accept("*reward_model.rollout.mtp", (None,), "multi-token prediction"),
        accept("*reward_model.rollout.disaggregation.enabled", (False,), "prefill/decode disaggregation"),
        accept("*reward_model.rollout.ignore_eos", (False,), "verdicts that ignore the end of turn"),
        accept("*reward_model.rollout.full_determinism", (False,), "deterministic kernels"),
        accept("*reward_model.rollout.multi_stage_wake_up", (False,), "staged wake-up"),
        notice("*reward_model.rollout.disaggregation.*", "no disaggregation (disaggregation.enabled=False)"),
        notice("*reward_model.rollout.seed", "the judge's sampling follows trainer.seed"),
        notice("*reward_model.rollout.dtype", "the judge runs in the checkpoint's dtype (float32 on CPU)"),
        notice("*reward_model.rollout.limit_images", "the judge takes as many images as the data's prompts hold"),
        notice("*reward_model.rollout.*", "an engine speed setting the judge's engine does not take"),
        feature("reward.reward_model.*", "this reward-model key of verl 0.9.1"),
    ]
    # verl's legacy reward_model.* block leaves every value null (verl 0.9.1 migrates the set ones): null is "unset"
    return tuple(
        Rule(r.pattern, r.kind, r.why, r.target, (*r.values, None), r.mapping)
        if r.kind == ACCEPT and None not in r.values
        else r
        for r in rules
    )


# First match wins: specific patterns before general ones.
RULES: tuple[Rule, ...] = (
    # ---------------------------------------------------------------------------------------------- aliases
    alias("actor_rollout_ref.actor.freeze_vision_tower", "actor_rollout_ref.model.freeze_vision_tower"),
    alias("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"),
    alias("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.warmup_style"),
    alias("actor_rollout_ref.model.custom_chat_template", "data.custom_chat_template"),
    alias("critic.optim.clip_grad", "critic.grad_clip"),
    alias("critic.optim.lr_scheduler_type", "critic.optim.warmup_style"),
    *(
        alias(f"critic.model.fsdp_config.{k}", f"critic.fsdp.{k}", why="verl's older place of the critic's FSDP keys")
        for k in ("param_offload", "optimizer_offload", "fsdp_size")
    ),
    accept("reward_model.model.fsdp_config.fsdp_size", (-1,), "hybrid sharding of the reward model"),
    alias("reward.custom_reward_function.path", "custom_reward_function.path"),
    alias("reward.custom_reward_function.name", "custom_reward_function.name"),
    alias("reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"),
    alias("trainer.max_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep"),
    alias("trainer.use_ray", "trainer.launcher", mapping={False: "inline", True: "auto"}, why="vlmrl's older key"),
    *(
        alias(
            f"{g}.offload_policy",
            f"{g}.param_offload",
            mapping={False: DROP, True: True},
            why="FSDP2's CPUOffloadPolicy",
        )
        for g in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
    ),
    *(
        _engine(k)
        for k in (
            "max_num_seqs",
            "cudagraph_capture_sizes",
            "scheduling_policy",
            "disable_log_stats",
            "enable_prefix_caching",
            "logprobs_mode",
        )
    ),
    # ---------------------------------------------------------------------------------------------- notices
    notice("actor_rollout_ref.model.use_fused_kernels", "vlmrl computes log-probs and entropy with its own forward"),
    notice("actor_rollout_ref.actor.use_fused_kernels", "vlmrl computes log-probs and entropy with its own forward"),
    notice("actor_rollout_ref.model.fused_kernel_options.*", "no fused kernels in vlmrl"),
    notice("actor_rollout_ref.model.use_liger", "no Liger kernels in vlmrl (transformers' own modules run)"),
    notice("*.use_torch_compile", "vlmrl runs the model eagerly (no torch.compile)"),
    notice("*.entropy_from_logits_with_chunking", "vlmrl computes entropy from the response logits directly"),
    notice("*.entropy_from_logits_chunk_size", "vlmrl computes entropy from the response logits directly"),
    notice("*.entropy_checkpointing", "vlmrl computes entropy from the response logits directly"),
    alias(
        "actor_rollout_ref.actor.use_remove_padding",
        "actor_rollout_ref.model.use_remove_padding",
        why="verl's actor reads the model's setting",
    ),
    notice("*.fsdp_config.grad_offload", "FSDP2 keeps gradients where the parameters are (param_offload)"),
    feature("critic.model.fsdp_config.*", "verl's older place of the critic's FSDP keys: set critic.fsdp.<key>"),
    notice("critic.fsdp.forward_only", "the critic trains"),
    notice("critic.rollout_n", "a derived value: the samples per prompt are actor_rollout_ref.rollout.n"),
    notice("critic.data_loader_seed", "critic mini-batch shuffling (critic.shuffle) uses trainer.seed"),
    notice("critic.nccl_timeout", "actor_rollout_ref.nccl_timeout bounds every collective of the workers"),
    notice("critic.optim.zero_indexed_step", "the learning-rate schedule counts from step 0"),
    notice("critic.model.lora_alpha", "the critic has no LoRA (critic.model.lora_rank=0)"),
    notice("critic.model.target_modules", "the critic has no LoRA (critic.model.lora_rank=0)"),
    notice("critic.model.exclude_modules", "the critic has no LoRA (critic.model.lora_rank=0)"),
    notice("*.pad_to_length", "vlmrl trims padding per micro-batch"),
    notice("*.pad_to_length_bucket", "vlmrl trims padding per micro-batch"),
    *(rule for group in FSDP_GROUPS for rule in _fsdp_notices(group)),
    notice("*.fsdp_config.forward_only", "the reference is forward-only, the actor is not"),
    notice("*.use_shm", "models and data load from disk"),
    notice("actor_rollout_ref.actor.calculate_entropy", "vlmrl always computes and logs entropy"),
    notice("actor_rollout_ref.actor.use_prefix_grouper", "vlmrl always runs each prompt once for its n samples"),
    notice("actor_rollout_ref.actor.data_loader_seed", "mini-batch shuffling (actor.shuffle) uses trainer.seed"),
    notice("actor_rollout_ref.actor.optim.zero_indexed_step", "the learning-rate schedule counts from step 0"),
    notice("actor_rollout_ref.rollout.calculate_log_probs", "the engine always reports sampled-token log-probs"),
    notice("actor_rollout_ref.rollout.layered_summon", "weights are pushed one FSDP unit at a time, LoRA merged"),
    notice("actor_rollout_ref.rollout.skip_tokenizer_init", "vlmrl gives the engine token ids either way"),
    notice(
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "weights are pushed one FSDP unit at a time",
    ),
    notice(
        "actor_rollout_ref.rollout.mode",
        "vlmrl runs the engine inside each worker; single-turn sampling is the same in verl's sync and async modes",
    ),
    notice("data.filter_overlong_prompts_workers", "the overlong filter tokenises in batches in one process"),
    notice("data.return_raw_chat", "rewards always see the chat messages"),
    notice(
        "data.return_raw_input_ids",
        "the reward model re-renders each conversation itself when reward_model.model.input_tokenizer is set",
    ),
    notice("data.return_full_prompt", "rewards always get the rendered prompt (RewardSample.prompt)"),
    notice("data.return_multi_modal_inputs", "image inputs are processed once per prompt in the trainer"),
    notice("trainer.balance_batch", "each worker gets an equal share of the prompts"),
    notice("trainer.ray_wait_register_center_timeout", "vlmrl's workers report readiness directly"),
    notice("trainer.use_legacy_worker_impl", "vlmrl has one worker implementation"),
    notice("trainer.use_v1", "vlmrl has one trainer"),
    # ------------------------------------------------------------------------ accepted at the value meaning "off"
    accept("algorithm.use_pf_ppo", (False,), "PF-PPO"),
    feature("algorithm.pf_ppo.*", "PF-PPO"),
    accept("algorithm.filter_groups.max_inflight_gen_batches", (1,), "overlapping generation batches"),
    alias("async.fallback_kl", "async_training.fallback_kl"),
    alias("async.tis_by_default", "async_training.tis_by_default"),
    alias(
        "async_training.use_rollout_log_probs",
        "algorithm.rollout_correction.bypass_mode",
        why="the engine's log-probs as the old ones",
    ),
    notice(
        "async_training.compute_prox_log_prob",
        "the trainer recomputes the old log-probs whenever algorithm.rollout_correction.bypass_mode=False",
    ),
    notice(
        "async_training.checkpoint_engine.*",
        "the weights go to the rollout pool as bucketed broadcasts of one dtype each (vlmrl.workers.sync)",
    ),
    accept("async_training.use_trainer_do_validate", (False,), "validation on the training pool"),
    notice("rollout.total_epochs", "verl's rollouter and vlmrl read trainer.total_epochs"),
    accept("trainer.default_hdfs_dir", (None,), "copying checkpoints to HDFS"),
    accept("trainer.del_local_ckpt_after_load", (False,), "deleting checkpoints after loading"),
    accept("trainer.esi_redundant_time", (0, 0.0), "elastic (ESI) checkpoint timing"),
    accept("trainer.checkpoint_callback_class", (None,), "checkpoint callbacks"),
    notice(
        "trainer.max_critic_ckpt_to_keep",
        "the critic is saved in each checkpoint beside the actor "
        "(trainer.max_actor_ckpt_to_keep keeps whole checkpoints)",
    ),
    feature("trainer.v1.*", "verl's v1 trainer modes (async / colocated variants)"),
    accept(
        "actor_rollout_ref.model.enable_activation_offload",
        (False,),
        "activation offloading (use actor_rollout_ref.model.enable_gradient_checkpointing=True)",
    ),
    accept("actor_rollout_ref.model.external_lib", (None,), "importing a model library"),
    accept("critic.model.lora_rank", (0,), _CRITIC_LORA),
    accept("critic.model.lora_adapter_path", (None,), _CRITIC_LORA),
    feature("critic.model.lora.*", _CRITIC_LORA),
    accept("critic.model.external_lib", (None,), "importing a model library"),
    accept("critic.model.hf_config_path", (None,), "a separate model config (vlmrl reads critic.model.path)"),
    accept("critic.model.tokenizer_path", (None,), "a critic with another tokenizer (it reads the actor's tokens)"),
    accept("critic.model.custom_chat_template", (None,), "a critic with another chat template"),
    accept("critic.model.override_config", ({},), "overriding the critic model's config"),
    accept("critic.model.enable_activation_offload", (False,), "activation offloading"),
    accept("critic.model.use_fused_kernels", (False,), "fused kernels"),
    notice("critic.model.fused_kernel_options.*", "no fused kernels in vlmrl"),
    notice("critic.model.use_liger", "no Liger kernels in vlmrl (transformers' own modules run)"),
    accept("critic.model.tiled_mlp.enabled", (False,), "tiled MLP"),
    notice("critic.model.tiled_mlp.*", "tiled MLP is off"),
    *_trained_model("critic"),
    feature(
        "critic.ppo_micro_batch_size",
        "the global micro-batch size (deprecated in verl): set critic.ppo_micro_batch_size_per_gpu",
    ),
    feature(
        "critic.forward_micro_batch_size",
        "the global micro-batch size (deprecated in verl): set critic.forward_micro_batch_size_per_gpu",
    ),
    accept("actor_rollout_ref.model.hf_config_path", (None,), "a separate model config (vlmrl reads model.path)"),
    accept("actor_rollout_ref.model.tokenizer_path", (None,), "a separate tokenizer (vlmrl reads model.path)"),
    accept("actor_rollout_ref.model.lora_adapter_path", (None,), "starting LoRA from saved adapters"),
    accept("actor_rollout_ref.model.override_config", ({},), "overriding the model's config"),
    accept("actor_rollout_ref.model.tiled_mlp.enabled", (False,), "tiled MLP"),
    notice("actor_rollout_ref.model.tiled_mlp.*", "tiled MLP is off"),
    accept("*.mtp.enable*", (False,), "multi-token prediction"),
    accept("actor_rollout_ref.rollout.mtp", (None,), "multi-token prediction"),
    feature("*.mtp.*", "multi-token prediction"),
    accept("*.qat.enable", (False,), "quantization-aware training"),
    accept("actor_rollout_ref.rollout.qat", (None,), "quantization-aware training"),
    feature("*.qat.*", "quantization-aware training"),
    feature("actor_rollout_ref.model.lora.*", "Megatron LoRA settings (vlmrl: actor_rollout_ref.model.lora_rank)"),
    feature("*.turbo_config.*", "verl's turbo FSDP engine"),
    accept("*.ulysses_sequence_parallel_size", (1,), "Ulysses sequence parallelism"),
    *(rule for group in FSDP_GROUPS for rule in _fsdp_accepts(group)),
    notice(
        "actor_rollout_ref.actor.calculate_sum_pi_squared",
        "vlmrl computes the policy's sum of squared token "
        "probabilities when the estimator needs it (the optimal-token-baseline pair)",
    ),
    accept("actor_rollout_ref.actor.checkpoint.strict", (True,), "non-strict checkpoint loading"),
    *_trained_model("actor_rollout_ref.actor"),
    feature("actor_rollout_ref.*.rollout_n", "a derived value: set actor_rollout_ref.rollout.n"),
    feature(
        "actor_rollout_ref.actor.ppo_micro_batch_size",
        "the global micro-batch size (deprecated in verl): set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    ),
    feature(
        "actor_rollout_ref.*.log_prob_micro_batch_size",
        "the global micro-batch size (deprecated in verl): set the matching log_prob_micro_batch_size_per_gpu",
    ),
    accept(
        "actor_rollout_ref.rollout.do_sample",
        (True,),
        "greedy training rollouts (GRPO compares sampled "
        "responses; validation is greedy by default: rollout.val_kwargs.do_sample)",
    ),
    accept("actor_rollout_ref.rollout.over_sample_rate", (0, 0.0), "over-sampling and cancelling slow requests"),
    accept("actor_rollout_ref.rollout.data_parallel_size", (1,), "data-parallel engines inside one worker"),
    accept("actor_rollout_ref.rollout.expert_parallel_size", (1,), "expert parallelism (MoE)"),
    accept("actor_rollout_ref.rollout.pipeline_model_parallel_size", (1,), "pipeline-parallel rollout"),
    accept("actor_rollout_ref.rollout.full_determinism", (False,), "deterministic rollout kernels"),
    accept("actor_rollout_ref.rollout.enable_rollout_routing_replay", (False,), _ROUTING_REPLAY),
    accept("actor_rollout_ref.rollout.moe_load_balance_metrics_interval", (0,), "MoE load-balance metrics"),
    accept("actor_rollout_ref.rollout.multi_stage_wake_up", (False,), "multi-stage wake-up (an SGLang feature)"),
    accept("actor_rollout_ref.rollout.quantization", (None,), "quantized (fp8) rollout"),
    accept("actor_rollout_ref.rollout.quantization_config_file", (None,), "quantized (fp8) rollout"),
    accept("actor_rollout_ref.rollout.router_config_path", (None,), "a rollout router"),
    accept(
        "actor_rollout_ref.rollout.nnodes",
        (0,),
        "this key of the rollout pool (set rollout.nnodes with actor_rollout_ref.hybrid_engine=False, as verl's "
        "one-step off-policy scripts do)",
    ),
    feature(
        "actor_rollout_ref.rollout.n_gpus_per_node",
        "this key of the rollout pool (set rollout.n_gpus_per_node with actor_rollout_ref.hybrid_engine=False, as "
        "verl's one-step off-policy scripts do)",
    ),
    feature("actor_rollout_ref.rollout.prompt_length", "a derived value: set data.max_prompt_length"),
    feature("actor_rollout_ref.rollout.response_length", "a derived value: set data.max_response_length"),
    accept("actor_rollout_ref.rollout.disaggregation.enabled", (False,), "prefill/decode disaggregation"),
    notice("actor_rollout_ref.rollout.disaggregation.*", "prefill/decode disaggregation is off"),
    accept("actor_rollout_ref.rollout.prometheus.enable", (False,), "the vLLM server's Prometheus metrics"),
    notice("actor_rollout_ref.rollout.prometheus.*", "the vLLM server's Prometheus metrics are off"),
    accept("actor_rollout_ref.rollout.trace.backend", (None,), "rollout tracing (weave / mlflow)"),
    notice("actor_rollout_ref.rollout.trace.*", "rollout tracing is off"),
    accept(
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        ("naive", "nccl"),
        "weight-sync backends other than a collective broadcast",
    ),
    accept("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", (None,), "weight-sync backends"),
    accept("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs", ({},), "weight-sync backends"),
    accept("actor_rollout_ref.rollout.agent.custom_async_server.*", (None,), "custom async rollout servers"),
    accept("actor_rollout_ref.rollout.agent.agent_loop_config_path", (None,), "agent loops"),
    accept("actor_rollout_ref.rollout.agent.default_agent_loop", ("single_turn_agent",), "agent loops"),
    notice("actor_rollout_ref.rollout.agent.num_workers", "rollouts run in the training workers"),
    accept("actor_rollout_ref.rollout.engine_kwargs.sglang", ({},), "the SGLang rollout (use rollout.name=vllm)"),
    feature("actor_rollout_ref.rollout.engine_kwargs.sglang.*", "the SGLang rollout (use rollout.name=vllm)"),
    accept("actor_rollout_ref.rollout.engine_kwargs.trtllm", ({},), "the TensorRT-LLM rollout"),
    feature("actor_rollout_ref.rollout.engine_kwargs.trtllm.*", "the TensorRT-LLM rollout (use rollout.name=vllm)"),
    accept("actor_rollout_ref.rollout.multi_turn.function_tool_path", (None,), _FUNCTION_TOOLS),
    accept(
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
        (None,),
        "simulated-user interactions are not implemented",
    ),
    accept(
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts",
        (None,),
        "repeated interaction rollouts are not implemented",
    ),
    accept(
        "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
        (False,),
        "re-rendering with the inference template: vlmrl keeps the policy's own tokens (token-in/token-out)",
    ),
    notice(
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode",
        "vlmrl never re-tokenises generated text (token-in/token-out): there is nothing to check",
    ),
    accept("data.tool_config_path", (None,), "tools declared in the data config (set multi_turn.tool_config_path)"),
    accept("data.function_tool_path", (None,), _FUNCTION_TOOLS),
    accept("data.tokenizer", (None,), "a separate tokenizer (vlmrl uses the model's processor)"),
    accept(
        "data.trust_remote_code",
        (False,),
        "remote code for the tokenizer (set actor_rollout_ref.model.trust_remote_code)",
    ),
    accept(
        "data.reward_fn_key",
        ("data_source",),
        "routing rewards by another column (reward.dispatch routes by data_source)",
    ),
    accept(
        "data.image_patch_size",
        (14, 16),
        "another vision patch size (vlmrl reads it from the model's processor: 14 for Qwen2-VL / Qwen2.5-VL, "
        "16 for Qwen3-VL)",
    ),
    accept("data.audio_key", ("audios",), "audio inputs"),
    accept("data.validation_shuffle", (False,), "shuffling the validation set"),
    accept("data.custom_cls.*", (None,), "a custom dataset class"),
    accept("data.apply_chat_template_kwargs", ({},), "chat-template keyword arguments"),
    accept(
        "data.mm_processor_kwargs",
        ({},),
        "processor keyword arguments (set data.min_pixels / data.max_pixels, and data.video_* for videos)",
    ),
    # ------------------------------------------------------------------------------------------ features (refused)
    # MoE training options of verl's Megatron scripts: named on their own, beside the Megatron refusal
    accept("*.megatron.expert_model_parallel_size", (1, None), _EXPERT_PARALLEL),
    accept("*.megatron.expert_tensor_parallel_size", (1, None), _EXPERT_PARALLEL),
    accept("*.megatron.router_replay.mode", ("disabled", None), _ROUTING_REPLAY),
    feature("*.megatron.*", _MEGATRON),
    feature("*.megatron", _MEGATRON),
    accept(
        "reward_model.reward_manager",
        ("naive", None),
        "other reward managers (vlmrl's scores every sample with "
        "the reward function, as verl's naive does; DAPO's overlong penalty is the length_penalty reward "
        "component; parallel scoring: reward.num_workers)",
    ),
    feature(
        "reward_model.overlong_buffer.*",
        "DAPO's overlong penalty as a reward-manager option (vlmrl: add "
        "{function: length_penalty, kwargs: {buffer_len: N, penalty_factor: F}} to reward.components)",
    ),
    *_reward_model_rules(),
    accept(
        "reward.reward_manager.name",
        ("naive",),
        "other reward managers (DAPO's overlong penalty is the length_penalty reward component)",
    ),
    accept("reward.reward_manager.source", ("register",), "custom reward managers"),
    accept("reward.reward_manager.module.*", (None, "custom_reward_manager"), "custom reward managers"),
    accept("*sandbox_fusion.url", (None,), "SandboxFusion code-execution rewards"),
    notice("*sandbox_fusion.*", "SandboxFusion is off (no url)"),
    accept("distillation.enabled", (False,), "distillation"),
    feature("distillation.*", "distillation"),
    accept("transfer_queue.enable", (False,), "TransferQueue"),
    feature("transfer_queue.*", "TransferQueue"),
    accept("global_profiler.tool", (None,), _PROFILER),
    accept("*.profiler.enable", (False,), _PROFILER),
    feature("global_profiler.*", _PROFILER),
    feature("*.profiler.*", _PROFILER),
    accept("skip.*.enable", (False,), "rollout dump / replay"),
    feature("skip.*", "rollout dump / replay"),
    feature("ray_kwargs.*", "Ray start options (vlmrl starts Ray itself; trainer.ray_address joins a cluster)"),
    feature("npu_profile.*", "Ascend NPU support"),
)


# schema keys whose values name verl features vlmrl does not implement: (key, value) -> reason
VALUE_REASONS: dict[tuple[str, Any], str] = {
    ("actor_rollout_ref.actor.strategy", "megatron"): f"not implemented in vlmrl: {_MEGATRON}",
    ("actor_rollout_ref.ref.strategy", "megatron"): f"not implemented in vlmrl: {_MEGATRON}",
    ("actor_rollout_ref.rollout.name", "sglang"): "the SGLang rollout is not implemented in vlmrl",
    ("actor_rollout_ref.rollout.name", "trtllm"): "the TensorRT-LLM rollout is not implemented in vlmrl",
    ("actor_rollout_ref.rollout.load_format", "dummy"): "vLLM's dummy load randomises persistent buffers that no "
    "weight push restores (Qwen2.5-VL's visual.input_norm, the attention scales): the engine would never match the "
    "policy; the engine reads the checkpoint itself",
    ("algorithm.kl_penalty", "full"): "the full-distribution KL is not implemented (verl 0.9.1 raises "
    "NotImplementedError for it too)",
    ("trainer.device", "npu"): "not implemented in vlmrl: Ascend NPUs (CUDA GPUs and CPUs are)",
}
