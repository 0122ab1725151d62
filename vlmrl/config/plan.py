"""Values derived from a config that the driver and the workers use: one place computes each.

``planned_device`` / ``planned_world`` / ``per_node`` (where the run trains), ``launcher_of`` / ``ray_address`` (how
its workers start), ``tp_size`` (workers sharing one
engine), ``token_budgets`` (micro-batches sized by tokens), and :class:`WorkerPlan`: what every hybrid worker is told,
its part of the config and the values the driver derived for it (built by :func:`worker_plan`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from vlmrl.config.schema import ActorRolloutRefConfig, VLMRLConfig


def planned_device(cfg: VLMRLConfig, cuda_available: bool | None = None) -> str:
    """The device the run asks for: ``trainer.device``, with auto resolved by whether this machine has CUDA."""
    dev = cfg.trainer.device
    if dev == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        dev = "cuda" if cuda_available else "cpu"
    return dev


def per_node(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Workers on each machine: n_gpus_per_node on GPU, cpu_workers on CPU."""
    gpu = planned_device(cfg, cuda_available) == "cuda"
    return cfg.trainer.n_gpus_per_node if gpu else cfg.trainer.cpu_workers


def planned_world(cfg: VLMRLConfig, cuda_available: bool | None = None) -> int:
    """Hybrid workers the run asks for: 1 inline, else nnodes x (n_gpus_per_node on GPU, cpu_workers on CPU)."""
    if cfg.trainer.launcher == "inline":
        return 1
    return cfg.trainer.nnodes * per_node(cfg, cuda_available)


LAUNCHERS = ("auto", "local", "ray", "inline")
"""Values of ``trainer.launcher``."""


def launcher_of(cfg: VLMRLConfig) -> str:
    """The launcher a config asks for: ``auto`` is ray when a cluster address is given or the run spans several
    machines (``trainer.nnodes`` > 1: it joins the cluster this machine is part of, as verl's ``ray.init()`` does),
    else local."""
    if cfg.trainer.launcher != "auto":
        return cfg.trainer.launcher
    return "ray" if (ray_address(cfg) or cfg.trainer.nnodes > 1) else "local"


def ray_address(cfg: VLMRLConfig) -> str | None:
    """The cluster to join: ``trainer.ray_address``, else ``RAY_ADDRESS``, else ``auto`` when the run spans several
    machines (the cluster this machine joined with ``ray start``); None = start a private one-machine cluster."""
    return cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS") or ("auto" if cfg.trainer.nnodes > 1 else None)


def tp_size(cfg: VLMRLConfig) -> int:
    """Workers that share one rollout engine (``rollout.tensor_model_parallel_size`` with vLLM; 1 with HF)."""
    ro = cfg.actor_rollout_ref.rollout
    return ro.tensor_model_parallel_size if ro.name == "vllm" else 1


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


def worker_plan(
    cfg: VLMRLConfig, total_steps: int, data_images: int, data_videos: int, cuda_available: bool | None = None
) -> WorkerPlan:
    """The plan every worker of ``cfg``'s run gets; ``data_images`` / ``data_videos``: the most a prompt of the
    training and validation data holds."""
    arr, data = cfg.actor_rollout_ref, cfg.data
    ro, mt = arr.rollout, arr.rollout.multi_turn
    return WorkerPlan(
        arr=arr,
        device=planned_device(cfg, cuda_available),
        world=planned_world(cfg, cuda_available),
        tp=tp_size(cfg),
        seed=cfg.trainer.seed,
        total_steps=total_steps,
        max_response_length=data.max_response_length,
        max_model_len=ro.max_model_len or (data.max_prompt_length + data.max_response_length),
        image_bounds=(data.min_pixels, data.max_pixels),
        video_bounds=(data.video_min_pixels, data.video_max_pixels),
        limit_images=(ro.limit_images or data_images) + (mt.max_tool_images if mt.enable else 0),
        limit_videos=ro.limit_videos if ro.limit_videos is not None else data_videos,
    )
