"""Values derived from a config that the driver and the workers use: one place computes each.

``planned_device`` / ``planned_world`` / ``per_node`` (where the run trains), ``launcher_of`` / ``ray_address`` (how
its workers start), ``tp_size`` (workers sharing one
engine), ``token_budgets`` (micro-batches sized by tokens), ``critic_plan`` (the critic's settings with verl's defaults
resolved), :class:`RunPlan`: all of them computed once by the config gate (``run_plan``), and :class:`WorkerPlan`:
what every hybrid worker is told, its part of the config and the values the driver derived for it (built by
:func:`worker_plan`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vlmrl.config.schema import (
    ActorRolloutRefConfig,
    FSDPConfig,
    OptimConfig,
    RolloutConfig,
    RolloutCorrectionConfig,
    VLMRLConfig,
)

if TYPE_CHECKING:
    from vlmrl.algorithms.estimators import Needs


def planned_device(cfg: VLMRLConfig, cuda_available: bool | None = None) -> str:
    """The device the run asks for: ``trainer.device``, with auto resolved by whether this machine has CUDA."""
    dev = cfg.trainer.device
    if dev == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        dev = "cuda" if cuda_available else "cpu"
    return dev


GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd")
"""Files a machine whose torch may see a GPU has (NVIDIA's driver, ROCm's): on a machine with none of them
``trainer.device=auto`` is the CPU."""


def surely_local_cpu(cfg: Any) -> bool:
    """Whether ``cfg`` (the typed config, or Hydra's composition of it before the checks) runs its workers on this
    machine's CPU with the local launcher, told without importing torch: ``trainer.device=cpu``, or ``auto`` on a
    machine without a GPU driver's files (:data:`GPU_DRIVER_FILES`). False where it cannot be told so; the gate's
    :func:`run_plan` decides for certain."""
    try:
        device = cfg.trainer.device
        if device == "auto" and not any(os.path.exists(f) for f in GPU_DRIVER_FILES):
            device = "cpu"
        return device == "cpu" and launcher_of(cfg) == "local"
    except Exception:  # noqa: BLE001 - a composition the checks will refuse: the plan decides after them
        return False


def per_node(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Workers on each machine: n_gpus_per_node on GPU, cpu_workers on CPU."""
    gpu = planned_device(cfg, cuda_available) == "cuda"
    return cfg.trainer.n_gpus_per_node if gpu else cfg.trainer.cpu_workers


def planned_world(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Hybrid (or, with ``hybrid_engine=False``, training) workers the run asks for: 1 inline, else nnodes x
    (n_gpus_per_node on GPU, cpu_workers on CPU)."""
    if cfg.trainer.launcher == "inline":
        return 1
    return cfg.trainer.nnodes * per_node(cfg, cuda_available)


def separate_pools(cfg: VLMRLConfig) -> bool:
    """Whether the run has a rollout pool of its own (``actor_rollout_ref.hybrid_engine=False``: the one-step
    off-policy trainer)."""
    return not cfg.actor_rollout_ref.hybrid_engine


def rollout_per_node(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Rollout workers on each machine of the rollout pool: rollout.n_gpus_per_node on GPU, rollout.cpu_workers on
    CPU."""
    gpu = planned_device(cfg, cuda_available) == "cuda"
    return cfg.rollout.n_gpus_per_node if gpu else cfg.rollout.cpu_workers


def rollout_world(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Workers of the rollout pool: rollout.nnodes x ``rollout_per_node``; 0 with the hybrid engine."""
    return cfg.rollout.nnodes * rollout_per_node(cfg, cuda_available) if separate_pools(cfg) else 0


LAUNCHERS = ("auto", "local", "ray", "inline")
"""Values of ``trainer.launcher``."""


def launcher_of(cfg: VLMRLConfig) -> str:
    """The launcher a config asks for: ``auto`` is ray when a cluster address is given or the run spans several
    machines (``trainer.nnodes`` > 1: it joins the cluster this machine is part of, as verl's ``ray.init()`` does),
    else local."""
    if cfg.trainer.launcher != "auto":
        return cfg.trainer.launcher
    return "ray" if (ray_address(cfg) or spans_nodes(cfg)) else "local"


def spans_nodes(cfg: VLMRLConfig) -> bool:
    """Whether the run needs more than one machine (``trainer.nnodes`` > 1, or a rollout pool on ``rollout.nnodes``
    > 1: the pools then may sit on different machines)."""
    return cfg.trainer.nnodes > 1 or (separate_pools(cfg) and cfg.rollout.nnodes > 1)


def ray_address(cfg: VLMRLConfig) -> str | None:
    """The cluster to join: ``trainer.ray_address``, else ``RAY_ADDRESS``, else ``auto`` when the run spans several
    machines (the cluster this machine joined with ``ray start``); None = start a private one-machine cluster."""
    return cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS") or ("auto" if spans_nodes(cfg) else None)


def tp_size(cfg: VLMRLConfig) -> int:
    """Workers that share one rollout engine (``rollout.tensor_model_parallel_size`` with vLLM; 1 with HF)."""
    ro = cfg.actor_rollout_ref.rollout
    return ro.tensor_model_parallel_size if ro.name == "vllm" else 1


def multi_turn_schedule(rollout: RolloutConfig, streamed: bool = False) -> str:
    """How multi-turn rollouts of ``actor_rollout_ref.rollout`` will be scheduled, in words (the dry run's plan;
    ``rollout.multi_turn.MultiTurnAgent.per_trajectory`` decides at run time from the same facts). ``streamed``: the
    fully asynchronous trainer's rollout (``rollout.stream_turns``; its gate refuses what would not run per
    trajectory)."""
    mt = rollout.multi_turn
    if streamed:
        return "per trajectory, streamed group by group (each one's next turn starts when its tool calls return)"
    if mt.schedule == "turn":
        return "turn by turn (multi_turn.schedule=turn)"
    why = [
        "the HF rollout generates batch by batch" if rollout.name != "vllm" else "",
        "tool_workers=0 runs calls one after another" if mt.tool_workers == 0 else "",
        "no tool_config_path: every call is answered as an unknown tool" if not mt.tool_config_path else "",
        "a tensor-parallel engine's ranks take the same steps" if rollout.tensor_model_parallel_size > 1 else "",
    ]
    why = [w for w in why if w]
    if why:
        return "turn by turn (" + "; ".join(why) + ")"
    return "per trajectory (each one's next turn starts when its tool calls return)"


def token_budgets(arr: ActorRolloutRefConfig) -> dict[str, tuple[str, bool, int]]:
    """For the update (``update``), the old-log-prob (``actor``) and the reference (``ref``) forwards: (budget key,
    dynamic batch sizes on, token budget), with verl's defaults resolved (the log-prob settings follow the actor's
    when unset)."""
    a = arr.actor
    out = {
        "update": ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu)
    }
    for which, name, c in (("actor", "rollout", arr.rollout), ("ref", "ref", arr.ref)):
        on = a.use_dynamic_bsz if c.log_prob_use_dynamic_bsz is None else bool(c.log_prob_use_dynamic_bsz)
        budget = (
            a.ppo_max_token_len_per_gpu
            if c.log_prob_max_token_len_per_gpu is None
            else c.log_prob_max_token_len_per_gpu
        )
        out[which] = (f"actor_rollout_ref.{name}.log_prob_max_token_len_per_gpu", on, budget)
    return out


def needs_of(cfg: VLMRLConfig) -> Needs:
    """What ``algorithm.adv_estimator`` declares it needs (``vlmrl.algorithms.estimators.Needs``); the default for a
    name that does not resolve (the config's check reports that name)."""
    # torch: loaded when a check or the trainer asks, not by importing vlmrl.config
    from vlmrl.algorithms.estimators import Needs, estimator_needs

    try:
        return estimator_needs(cfg.algorithm.adv_estimator)
    except (ValueError, FileNotFoundError, AttributeError, ImportError):
        return Needs()


def critic_enabled(cfg: VLMRLConfig) -> bool:
    """Whether the run builds a critic: ``critic.enable``, else (verl's rule) when the estimator needs one (GAE)."""
    enable = cfg.critic.enable
    return needs_of(cfg).critic if enable is None else bool(enable)


def reference_needed(cfg: VLMRLConfig) -> bool:
    """Whether the workers build the frozen reference: for the KL loss or the in-reward KL."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


@dataclass(frozen=True)
class RewardModelPlan:
    """What a worker needs to build the discriminative reward model (``reward_model.*``, resolved by the driver)."""

    path: str
    trust_remote_code: bool
    micro_batch_size: int
    max_length: int | None
    rerender: bool
    """``model.input_tokenizer`` is set: re-render each conversation in the reward model's own template."""
    param_offload: bool
    dtype: str


@dataclass
class CriticPlan:
    """The critic's settings with every "the actor's value" default resolved (``critic_plan``)."""

    path: str
    trust_remote_code: bool
    gradient_checkpointing: bool
    use_remove_padding: bool
    optim: OptimConfig
    fsdp: FSDPConfig
    mini_batch_size: int
    """Prompts per critic optimizer step."""
    micro_batch_size: int
    forward_micro_batch_size: int
    use_dynamic_bsz: bool
    max_token_len: int
    forward_max_token_len: int
    epochs: int
    shuffle: bool
    cliprange_value: float
    loss_agg_mode: str
    grad_clip: float


def critic_plan(cfg: VLMRLConfig) -> CriticPlan | None:
    """The critic's resolved settings (None without a critic): verl interpolates the actor's mini-batch size,
    dynamic batching, epochs, shuffling and loss aggregation, and the model path defaults to the actor's."""
    if not critic_enabled(cfg):
        return None
    c, a, m = cfg.critic, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.model
    micro = c.ppo_micro_batch_size_per_gpu or a.ppo_micro_batch_size_per_gpu
    return CriticPlan(
        path=c.model.path or m.path,
        trust_remote_code=c.model.trust_remote_code or (c.model.path is None and m.trust_remote_code),
        gradient_checkpointing=c.model.enable_gradient_checkpointing,
        use_remove_padding=c.model.use_remove_padding,
        optim=c.optim,
        fsdp=c.fsdp,
        mini_batch_size=c.ppo_mini_batch_size or a.ppo_mini_batch_size,
        micro_batch_size=micro,
        forward_micro_batch_size=c.forward_micro_batch_size_per_gpu or micro,
        use_dynamic_bsz=a.use_dynamic_bsz if c.use_dynamic_bsz is None else bool(c.use_dynamic_bsz),
        max_token_len=c.ppo_max_token_len_per_gpu,
        forward_max_token_len=c.forward_max_token_len_per_gpu or c.ppo_max_token_len_per_gpu,
        epochs=c.ppo_epochs or a.ppo_epochs,
        shuffle=a.shuffle if c.shuffle is None else bool(c.shuffle),
        cliprange_value=c.cliprange_value,
        loss_agg_mode=c.loss_agg_mode or a.loss_agg_mode,
        grad_clip=c.grad_clip,
    )


@dataclass
class WorkerPlan:
    """What every hybrid worker is told: ``actor_rollout_ref`` (model, actor, reference, rollout) and what the driver
    derived from the whole config and the data."""

    arr: ActorRolloutRefConfig
    device: str
    """cpu or cuda, resolved once by the driver."""
    world: int
    """Hybrid workers in the run."""
    tp: int
    """Workers that share one rollout engine (``tp_size``)."""
    seed: int
    """``trainer.seed``."""
    total_steps: int
    """Optimizer steps of the run (the learning-rate schedule's length)."""
    max_response_length: int
    max_model_len: int
    """The engine's context: ``rollout.max_model_len``, else prompt + response lengths."""
    image_bounds: tuple[int | None, int | None]
    """``data.min_pixels`` / ``data.max_pixels`` (None: the processor's)."""
    video_bounds: tuple[int | None, int | None]
    """``data.video_min_pixels`` / ``data.video_max_pixels``."""
    limit_images: int
    """Images an engine request may hold: the most a prompt of the data holds (or ``rollout.limit_images``), plus
    ``multi_turn.max_tool_images`` when tools run."""
    limit_videos: int
    """Videos an engine request may hold: ``rollout.limit_videos``, else the most a prompt of the data holds."""
    critic: CriticPlan | None = None
    """The critic's settings (None: no critic)."""
    reference: bool = False
    """Build the frozen reference (``reference_needed``)."""
    rollout_correction: RolloutCorrectionConfig | None = None
    """``algorithm.rollout_correction`` when it applies (None: off)."""
    plugins: tuple[str, ...] = ()
    """``algorithm.plugins``: files/modules the worker imports before it looks up the policy loss."""
    algorithm: tuple[str | None, dict[str, Any]] = (None, {})
    """``algorithm.name`` and its ``params``: the class each worker builds (its state arrives with each shard)."""
    reward_model: RewardModelPlan | None = None
    """The discriminative reward model the training workers hold (None: none, or a judge)."""
    role: str = "hybrid"
    """hybrid (policy, reference and engine in one worker) | actor (the training pool of ``hybrid_engine=False``:
    policy, reference, critic; no engine) | rollout (its rollout pool: the engine only)."""
    launcher: str = "local"
    """How the workers start (``RunPlan.launcher``): local processes, inline, or Ray actors."""


def reward_model_plan(cfg: VLMRLConfig) -> RewardModelPlan | None:
    """The workers' discriminative reward model (None: no reward model, or a judge)."""
    rm = cfg.reward_model
    if not rm.enable or rm.style != "discriminative":
        return None
    return RewardModelPlan(
        path=str(rm.model.path),
        trust_remote_code=bool(rm.model.trust_remote_code),
        micro_batch_size=int(rm.micro_batch_size_per_gpu),
        max_length=rm.max_length,
        rerender=rm.model.input_tokenizer is not None,
        param_offload=bool(rm.model.fsdp_config.param_offload),
        dtype=str(rm.model.fsdp_config.dtype),
    )


@dataclass(frozen=True)
class RunPlan:
    """What the config gate derives from a config, once (``run_plan``, carried by ``command.Composed``): the
    checks, the dry run, the trainer and the launchers read these fields instead of deriving them again. (The Ray
    launcher alone resolves ``trainer.device=auto`` once more, against the cluster's resources, which the driver's
    machine may not share.)"""

    device: str
    """cpu or cuda (``planned_device``)."""
    launcher: str
    """local | inline | ray (``launcher_of``)."""
    per_node: int
    """Hybrid (or training) workers on each machine."""
    world: int
    """Hybrid (or training) workers in the run (``planned_world``)."""
    separate_pools: bool
    """A rollout pool of its own (``hybrid_engine=False``: the one-step off-policy trainer)."""
    rollout_per_node: int
    rollout_world: int
    """Workers of the rollout pool (0 with the hybrid engine)."""
    spans_nodes: bool
    ray_address: str | None
    """The Ray cluster to join (``ray_address``; None: a private one, or no Ray)."""
    tp: int
    """Workers that share one rollout engine (``tp_size``)."""
    critic: CriticPlan | None
    reference: bool
    rollout_correction: RolloutCorrectionConfig | None
    reward_model: RewardModelPlan | None
    needs: Needs
    """What ``algorithm.adv_estimator`` declares it needs."""


def run_plan(cfg: VLMRLConfig, cuda_available: bool | None = None) -> RunPlan:
    """Every derived value of ``cfg`` the layers after the gate read (``cuda_available``: None asks torch, when
    ``trainer.device=auto``)."""
    device = planned_device(cfg, cuda_available)
    cuda = device == "cuda"
    return RunPlan(
        device=device,
        launcher=launcher_of(cfg),
        per_node=per_node(cfg, cuda),
        world=planned_world(cfg, cuda),
        separate_pools=separate_pools(cfg),
        rollout_per_node=rollout_per_node(cfg, cuda),
        rollout_world=rollout_world(cfg, cuda),
        spans_nodes=spans_nodes(cfg),
        ray_address=ray_address(cfg),
        tp=tp_size(cfg),
        critic=critic_plan(cfg),
        reference=reference_needed(cfg),
        rollout_correction=rollout_correction(cfg),
        reward_model=reward_model_plan(cfg),
        needs=needs_of(cfg),
    )


def worker_plan(
    cfg: VLMRLConfig,
    total_steps: int,
    data_images: int,
    data_videos: int,
    cuda_available: bool | None = None,
    run: RunPlan | None = None,
) -> WorkerPlan:
    """The plan every worker of ``cfg``'s run gets; ``data_images`` / ``data_videos``: the most a prompt of the
    training and validation data holds; ``run``: the gate's plan (None: derived here)."""
    run = run or run_plan(cfg, cuda_available)
    arr, data = cfg.actor_rollout_ref, cfg.data
    ro, mt = arr.rollout, arr.rollout.multi_turn
    return WorkerPlan(
        arr=arr,
        device=run.device,
        world=run.world,
        tp=1 if run.separate_pools else run.tp,
        seed=cfg.trainer.seed,
        total_steps=total_steps,
        max_response_length=data.max_response_length,
        max_model_len=ro.max_model_len or (data.max_prompt_length + data.max_response_length),
        image_bounds=(data.min_pixels, data.max_pixels),
        video_bounds=(data.video_min_pixels, data.video_max_pixels),
        limit_images=(ro.limit_images or data_images) + (mt.max_tool_images if mt.enable else 0),
        limit_videos=ro.limit_videos if ro.limit_videos is not None else data_videos,
        critic=run.critic,
        reference=run.reference,
        rollout_correction=run.rollout_correction,
        plugins=tuple(cfg.algorithm.plugins),
        algorithm=(cfg.algorithm.name, dict(cfg.algorithm.params)),
        reward_model=run.reward_model,
        role="actor" if run.separate_pools else "hybrid",
        launcher=run.launcher,
    )


def rollout_plan(
    cfg: VLMRLConfig, plan: WorkerPlan, cuda_available: bool | None = None, run: RunPlan | None = None
) -> WorkerPlan:
    """What each worker of the rollout pool is told (``hybrid_engine=False``): the training plan's engine settings
    on the rollout pool's workers, with no critic, reference or correction (they train nothing)."""
    run = run or run_plan(cfg, cuda_available)
    return dataclasses.replace(
        plan,
        role="rollout",
        world=run.rollout_world,
        tp=run.tp,
        critic=None,
        reference=False,
        rollout_correction=None,
        reward_model=None,
    )


def rollout_correction(cfg: VLMRLConfig) -> RolloutCorrectionConfig | None:
    """``algorithm.rollout_correction`` when it applies (None: off). The one-step off-policy trainer with no
    correction set (and ``async_training.tis_by_default``) corrects with token-level truncated importance sampling
    at 2.0, verl's ``rollout_is=token``."""
    rc = cfg.algorithm.rollout_correction
    if rc.enabled:
        return rc
    if separate_pools(cfg) and cfg.async_training.tis_by_default:
        return RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
    return None
