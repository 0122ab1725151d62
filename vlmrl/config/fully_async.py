"""``async_training.mode=fully_async`` (verl's ``fully_async_policy``): its defaults, the batch size it implies and
what it cannot run with. The trainer's side is ``vlmrl.trainer.fully_async``."""

from __future__ import annotations

import math
from typing import Any

VERL_DEFAULTS: dict[str, Any] = {
    "staleness_threshold": 0.1,
    "trigger_parameter_sync_step": 4,
    "require_batches": 1,
    "partial_rollout": True,
}
"""verl's ``fully_async_ppo_trainer.yaml`` values of the keys left None."""


def is_fully_async(cfg: Any) -> bool:
    """The run streams (``async_training.mode=fully_async``)."""
    return cfg.async_training.mode == "fully_async"


def resolve(cfg: Any) -> list[str]:
    """Fill the fully-async keys left None with verl's defaults and ``data.train_batch_size`` 0 (verl's scripts pass
    0: "not effective") with the groups a step trains on. Keys of the mode set without it are problems (they would
    do nothing)."""
    at = cfg.async_training
    if not is_fully_async(cfg):
        given = [(f"async_training.{k}", getattr(at, k)) for k in VERL_DEFAULTS if getattr(at, k) is not None]
        given += [(f"rollout.{k}", getattr(cfg.rollout, k)) for k in ("total_rollout_steps", "test_freq")]
        return [
            f"{k}={v!r} applies to async_training.mode=fully_async (this run is {at.mode}): set the mode "
            "(--config-name fully_async_ppo_trainer), or drop the key."
            for k, v in given
            if v is not None
        ]
    for k, v in VERL_DEFAULTS.items():
        if getattr(at, k) is None:
            setattr(at, k, v)
    if cfg.data.train_batch_size == 0:
        cfg.data.train_batch_size = at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    if cfg.rollout.test_freq is not None:
        freq = cfg.rollout.test_freq
        cfg.trainer.test_freq = freq * at.trigger_parameter_sync_step if freq > 0 else -1
    return []


def window(staleness_threshold: float, trigger_parameter_sync_step: int, groups_per_step: int) -> int:
    """Groups the rollout pool may start between two syncs, those still queued or generating from older weights
    counted (verl's ``(1 + staleness_threshold) * trigger_parameter_sync_step * require_batches *
    ppo_mini_batch_size``)."""
    return int((1 + float(staleness_threshold)) * trigger_parameter_sync_step * groups_per_step + 1e-9)


GROUPS_IN_FLIGHT_PER_ENGINE = 16
"""Prompt groups a rollout engine generates at once at most (verl's Rollouter: ``max_concurrent_samples = 16 x
servers``, each sample a prompt with its ``n`` responses). A group that shares its engine with fewer others
finishes sooner, so a step waits less for the first groups of a window; more would only queue in the engine."""


def in_flight(engines: int, budget: int) -> int:
    """Groups the Rollouter keeps generating at once on ``engines`` engines: 16 each, at most the window's
    ``budget`` (verl's ``min(16 x servers, max_required_samples)``)."""
    return min(GROUPS_IN_FLIGHT_PER_ENGINE * engines, budget)


def total_steps(cfg: Any, batches_per_epoch: int) -> int:
    """The run's training steps: ``trainer.total_training_steps``, else the epochs' batches, capped in fully_async
    mode by ``rollout.total_rollout_steps`` prompts (verl's rule)."""
    tr = cfg.trainer
    if tr.total_training_steps:
        return int(tr.total_training_steps)
    steps = batches_per_epoch * tr.total_epochs
    if is_fully_async(cfg) and cfg.rollout.total_rollout_steps is not None:
        steps = min(steps, cfg.rollout.total_rollout_steps // max(1, cfg.data.train_batch_size))
    return steps


def problems(cfg: Any, separate_pools: bool, tp: int) -> list[str]:
    """What a fully-async run cannot be (call after :func:`resolve`)."""
    if not is_fully_async(cfg):
        return []
    at, arr, p = cfg.async_training, cfg.actor_rollout_ref, []
    mode = "async_training.mode=fully_async"
    s = at.staleness_threshold
    if not (isinstance(s, (int, float)) and math.isfinite(s) and s >= 0):
        p.append(f"async_training.staleness_threshold={s!r}: a number >= 0 (0: every group starts after the sync).")
    for key in ("trigger_parameter_sync_step", "require_batches"):
        if getattr(at, key) < 1:
            p.append(f"async_training.{key}={getattr(at, key)}: at least 1.")
    mini = arr.actor.ppo_mini_batch_size
    if at.require_batches >= 1 and cfg.data.train_batch_size != at.require_batches * mini:
        p.append(
            f"data.train_batch_size={cfg.data.train_batch_size} with {mode}: a step trains on async_training."
            f"require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = {at.require_batches} x {mini} groups; "
            "set data.train_batch_size to that or 0 (as verl's scripts do)."
        )
    if not separate_pools:
        p.append(
            f"{mode} streams from a rollout pool of its own: set actor_rollout_ref.hybrid_engine=False (and the "
            "pool's size: rollout.nnodes, rollout.cpu_workers / rollout.n_gpus_per_node)."
        )
    if arr.rollout.name != "vllm":
        p.append(f"{mode} streams prompt groups through vLLM's engine: set actor_rollout_ref.rollout.name=vllm.")
    mt = arr.rollout.multi_turn
    if tp > 1 and mt.enable:
        p.append(
            f"{mode} with actor_rollout_ref.rollout.tensor_model_parallel_size={tp} and multi-turn tools: a "
            "trajectory's next turn enters its engine when its tool calls return, which the workers of a "
            "tensor-parallel engine would see at different steps; use 1 (each rollout worker its own engine)."
        )
    if mt.enable and mt.schedule != "trajectory":
        p.append(
            f"{mode} with actor_rollout_ref.rollout.multi_turn.schedule={mt.schedule}: the stream runs each "
            "trajectory's turns on its own schedule; set it to trajectory (or use the one-step off-policy trainer)."
        )
    if mt.enable and mt.tool_workers < 1:
        p.append(
            f"{mode} with actor_rollout_ref.rollout.multi_turn.tool_workers={mt.tool_workers}: streamed trajectories "
            "run their tool calls in worker processes beside the engine; set tool_workers >= 1."
        )
    if cfg.algorithm.filter_groups.enable:
        p.append(
            f"{mode} with algorithm.filter_groups.enable=True: dynamic sampling draws whole batches, and the stream "
            "draws one group at a time; use the one-step off-policy trainer or the hybrid engine for it."
        )
    if at.fallback_kl is not None:
        p.append(
            f"async_training.fallback_kl={at.fallback_kl} is the one-step off-policy trainer's; {mode} bounds "
            "staleness with async_training.staleness_threshold."
        )
    return p
