"""The data of one training step, as typed hand-offs (pure functions; the loop in ``trainer/grpo.py`` calls them):

prompt indices ──RLDataset.get_batch──▶ list[PromptSample]
  ──WorkerGroup.generate──▶ RolloutBatch (per worker, concatenated; ``origins``: where each group is kept)
  ──RewardSample.of_rollout──▶ list[RewardSample] (responses decoded once) ──RewardManager.score──▶ RewardOutput
[dynamic sampling: more batches, ``choose_groups``] ──assemble──▶ StepData (prompts, rollout, samples, scores)
  ──compute_advantages──▶ advantages ──plan_shards──▶ list[TrainShard] ──WorkerGroup.train──▶ metrics per worker
PPO path: ──plan_shards──▶ list[TrainShard] ──WorkerGroup.prepare──▶ list[PreparedShard] ──gather_prepared──▶
  TokenBatch ──token_targets──▶ advantages, returns [B, R] ──attach_token_targets──▶ list[TrainShard] ──update──▶
  ──step_metrics──▶ the step's metrics (timings, workers', rewards, lengths, multi-turn, advantages, throughput)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from vlmrl.algorithms.algorithm import AlgorithmError, RLAlgorithm, call_hook
from vlmrl.algorithms.estimators import EstimatorConfig
from vlmrl.algorithms.ppo import (
    KLController,
    explained_variance,
    kl_in_reward,
    masked_mean,
    token_advantages,
    token_scores,
)
from vlmrl.batch import PreparedShard, PromptSample, RewardSample, RolloutBatch, TrainShard, split_even
from vlmrl.config import AlgorithmConfig
from vlmrl.rollout.multi_turn import multi_turn_metrics
from vlmrl.scoring.manager import RewardOutput
from vlmrl.timing import Timer


@dataclass
class StepData:
    """What a step trains on: its prompt groups, their samples, the samples as rewards saw them, their scores."""

    prompts: list[PromptSample]
    rollout: RolloutBatch
    samples: list[RewardSample]
    scores: RewardOutput
    baselines: list[float] | None = None
    """Per sample: its prompt's greedy-rollout reward (ReMax's baseline; None for other estimators)."""


def assemble(collected: list[StepData], chosen: list[tuple[int, int]]) -> StepData:
    """The step made of ``chosen`` (batch, group) pairs taken from the rolled-out batches, in that order; the reward
    metrics describe exactly those samples (error counts cover every batch scored)."""
    if len(collected) == 1 and chosen == [(0, g) for g in range(len(collected[0].prompts))]:
        return collected[0]
    n = collected[0].rollout.n
    prompts = [collected[b].prompts[g] for b, g in chosen]
    rollout = RolloutBatch.concat([collected[b].rollout.select_groups([g]) for b, g in chosen])
    rollout.timing = collected[-1].rollout.timing
    samples = [s for b, g in chosen for s in collected[b].samples[g * n : (g + 1) * n]]
    picked = [(collected[b].scores, list(range(g * n, (g + 1) * n))) for b, g in chosen]
    scores = RewardOutput.combine(picked, samples, [c.scores for c in collected])
    baselines = None
    if collected[0].baselines is not None:
        baselines = [v for b, g in chosen for v in collected[b].baselines[g * n : (g + 1) * n]]  # type: ignore[index]
    return StepData(prompts, rollout, samples, scores, baselines)


def plan_shards(
    step: StepData, advantages: list[float] | None, world: int, mini_batch_samples: int, tp: int = 1
) -> list[TrainShard]:
    """Each worker's share of the step: the prompt groups split evenly over ranks in order; a group the worker's
    engine generated is named (the worker keeps it: every rank of a tensor-parallel group of ``tp`` does), any other
    is sent as data (only after dynamic sampling moved groups, or where a group's engine is another's).
    ``advantages`` None: they come later, per token (``attach_token_targets``)."""
    n, origins = step.rollout.n, step.rollout.origins
    shards = []
    for rank, groups in enumerate(split_even(list(range(len(step.prompts))), world)):
        own = [g for g in groups if origins and origins[g][0] == rank // tp]
        other = [g for g in groups if g not in own]
        order = own + other
        sent = ([step.prompts[g] for g in other], step.rollout.select_groups(other)) if other else None
        samples = [g * n + j for g in order for j in range(n)]
        shards.append(
            TrainShard(
                stored=[(origins[g][1], origins[g][2]) for g in own],
                sent=sent,
                advantages=[advantages[i] for i in samples] if advantages is not None else [],
                mini_batch_samples=mini_batch_samples,
                samples=samples,
            )
        )
    return shards


@dataclass
class TokenBatch:
    """The step's per-token tensors [B, R] from the workers' ``PreparedShard``s, rows in the step's sample order
    (R: the step's longest response; padding has mask 0)."""

    mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    sum_pi_squared: torch.Tensor | None = None


def gather_prepared(shards: list[TrainShard], prepared: list[PreparedShard], batch_size: int) -> TokenBatch:
    """Place every worker's rows at their samples' places in the step (one copy per sample: the ranks of a
    tensor-parallel group each prepared their own shard)."""
    R = max(p.response_mask.shape[1] for p in prepared)

    def gather(name: str) -> torch.Tensor | None:
        parts = [getattr(p, name) for p in prepared]
        if any(t is None for t in parts):
            return None
        out = torch.zeros((batch_size, R), dtype=torch.float32)
        for shard, t in zip(shards, parts):
            out[torch.tensor(shard.samples), : t.shape[1]] = t.float()
        return out

    mask = gather("response_mask")
    assert mask is not None
    return TokenBatch(mask, gather("old_logprobs"), gather("ref_logprobs"), gather("values"), gather("sum_pi_squared"))


def nonfinite_cause(tb: TokenBatch, rewards: torch.Tensor, scores: list[float]) -> str:
    """Why the advantages or returns are not finite, blaming the first input that is not: the critic's values (a
    diverged critic), the old or reference log-probs (the in-reward KL), the scores; else the estimator itself."""
    m = tb.mask > 0
    for name, t, fix in (
        ("the critic's values", tb.values, "the critic diverged: a smaller critic.optim.lr, critic.grad_clip"),
        ("the old log-probs", tb.old_logprobs, "the policy's forward gave NaN or inf"),
        ("the reference log-probs", tb.ref_logprobs, "the reference's forward gave NaN or inf"),
        ("the token rewards (scores minus the in-reward KL)", rewards, "check the scores and algorithm.kl_ctrl"),
    ):
        if t is not None and not torch.isfinite(t[m] if t.shape == m.shape else t).all():
            return f"non-finite advantages or returns: {name} are not finite ({fix})"
    return (
        f"non-finite advantages or returns from finite inputs (scores {scores[:16]}): the estimator produced them "
        "(a registered estimator dividing by a zero variance?)"
    )


def token_targets(
    step: StepData, tb: TokenBatch, alg: AlgorithmConfig, kl_ctrl: KLController | None
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """Per token: each sample's score on its last generated token, minus the in-reward KL penalty (with
    ``kl_ctrl``, which then adapts), then the estimator (GAE with the critic's values, or any other over the token
    rewards). Returns advantages [B, R], the critic's targets (None without values) and metrics."""
    scores = torch.tensor(step.scores.scores, dtype=torch.float32)
    rewards = token_scores(scores, tb.mask)
    metrics: dict[str, float] = {}
    if kl_ctrl is not None:
        assert tb.old_logprobs is not None and tb.ref_logprobs is not None
        rewards, metrics = kl_in_reward(rewards, tb.old_logprobs, tb.ref_logprobs, tb.mask, kl_ctrl, alg.kl_penalty)
    group = torch.arange(len(scores)) // step.rollout.n
    adv, returns = token_advantages(
        alg.adv_estimator,
        rewards,
        tb.mask,
        group,
        values=tb.values,
        config=EstimatorConfig.from_algorithm(alg),
        components=step.scores.components,
        baselines=step.baselines,
        old_logprobs=tb.old_logprobs,
        sum_pi_squared=tb.sum_pi_squared,
    )
    if not (torch.isfinite(adv).all() and torch.isfinite(returns).all()):
        raise FloatingPointError(nonfinite_cause(tb, rewards, step.scores.scores))
    if tb.values is None:
        return adv, None, metrics
    metrics["critic/vf_explained_var"] = explained_variance(tb.values, returns, tb.mask)
    metrics["critic/values/mean"] = float(masked_mean(tb.values, tb.mask))
    metrics["critic/returns/mean"] = float(masked_mean(returns, tb.mask))
    return adv, returns, metrics


def attach_token_targets(
    shards: list[TrainShard],
    prepared: list[PreparedShard],
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    critic_mini_batch_samples: int,
    update_actor: bool,
) -> list[TrainShard]:
    """The shards of a prepared step with their rows of the per-token advantages and value targets (cut to each
    shard's response width)."""
    for shard, p in zip(shards, prepared):
        rows, width = torch.tensor(shard.samples), p.response_mask.shape[1]
        shard.token_advantages = advantages[rows, :width].contiguous()
        shard.returns = returns[rows, :width].contiguous() if returns is not None else None
        shard.critic_mini_batch_samples = critic_mini_batch_samples
        shard.update_actor = update_actor
    return shards


def zero_variance_groups(scores: torch.Tensor, n: int) -> int:
    """How many prompts' n samples all got the same reward (their advantages are all zero: no learning signal)."""
    groups = scores.view(-1, n)
    return int((groups == groups[:, :1]).all(dim=1).sum())


def stats(prefix: str, values: list[float] | np.ndarray) -> dict[str, float]:
    """``prefix/{mean,std,max,min}`` of the values (nothing for none)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {}
    return {
        f"{prefix}/mean": float(a.mean()),
        f"{prefix}/std": float(a.std()),
        f"{prefix}/max": float(a.max()),
        f"{prefix}/min": float(a.min()),
    }


def mean_of_workers(dicts: list[dict[str, float]]) -> dict[str, float]:
    """The workers' metrics as one: the mean, but the slowest worker's time for ``timing/*``, the largest
    worker's memory for ``perf/*``, the total of the work counts ``work/*`` (tokens, patches) and the span of the
    wall-clock times ``timeline/*_start`` (the first) and ``timeline/*_end`` (the last)."""
    keys = set().union(*dicts)
    out = {}
    for k in keys:
        vals = [d[k] for d in dicts if k in d]
        if k.startswith("work/"):
            out[k] = float(sum(vals))
        elif k.startswith("timeline/"):
            out[k] = min(vals) if k.endswith("_start") else max(vals)
        else:
            out[k] = max(vals) if k.startswith(("timing/", "perf/")) else float(np.mean(vals))
    return out


def step_metrics(
    step: StepData, adv: torch.Tensor, worker_metrics: list[dict[str, float]], timer: Timer, epoch: int
) -> dict[str, float]:
    """A training step's metrics: the driver's stage timings (``timing/<stage>_s``), the workers' (update, push,
    memory: ``mean_of_workers``), the rewards', response lengths, multi-turn counts, the advantages and the
    throughput over ``timing/step_s``."""
    rb = step.rollout
    lengths = [len(r) for r in rb.response_ids]
    flat = zero_variance_groups(torch.tensor(step.scores.scores, dtype=torch.float32), rb.n)
    out = timer.metrics()
    out.update(mean_of_workers(worker_metrics))
    out.update(step.scores.metrics)
    out.update(stats("response_length", lengths))
    out["response_length/clip_ratio"] = float(np.mean([f == "length" for f in rb.finish_reasons]))
    if rb.trajectories:
        out.update(multi_turn_metrics(rb.trajectories))
        out["timing/tool_s"] = float(rb.timing.get("tool_s", 0.0))
        out["timing/tool_wait_s"] = float(rb.timing.get("tool_wait_s", 0.0))
    out["advantages/mean"] = float(adv.mean())
    out["advantages/abs_mean"] = float(adv.abs().mean())
    out["advantages/zero_variance_groups"] = float(flat)
    out["advantages/zero_variance_share"] = flat / max(1, len(lengths) // rb.n)
    tokens = sum(lengths) + sum(len(p) for p in rb.prompt_ids)
    out["throughput/tokens_per_s"] = tokens / max(out["timing/step_s"], 1e-9)
    out["training/epoch"] = float(epoch)
    return out


def hook_tensors(rollout: RolloutBatch) -> dict[str, torch.Tensor]:
    """The named tensors ``compute_loss`` gets, for the whole batch, as verl's batch holds them: ``prompts`` [B, P]
    (left-padded with 0), ``responses`` [B, R] (right-padded with 0), ``response_mask`` [B, R] (1 on the policy's
    tokens; a multi-turn sample's tool turns are 0), ``attention_mask`` [B, P+R] (1 on every real token),
    ``response_lengths`` [B] (generated tokens, tool turns included)."""
    B = len(rollout.response_ids)
    P = max((len(p) for p in rollout.prompt_ids), default=0)
    R = max((len(r) for r in rollout.response_ids), default=0)
    prompts, responses = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    attention, mask = torch.zeros(B, P + R, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(rollout.prompt_ids, rollout.response_ids, strict=True)):
        prompts[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        attention[i, P - len(p) : P + len(r)] = 1
        own = rollout.trajectories[i].response_mask if rollout.trajectories else [1] * len(r)
        mask[i, : len(r)] = torch.tensor(own, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rollout.response_ids], dtype=torch.long)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": mask,
        "attention_mask": attention,
        "response_lengths": lengths,
    }


def before_train_step(algo: RLAlgorithm, step: StepData, step_no: int, timeout_s: float | None = None) -> StepData:
    """The algorithm's ``before_train_step`` on this step's rewards (``vlmrl.algorithms.algorithm``); returns the step
    the advantages are computed from: its scores replaced by the hook's ``rewards`` (the logged reward metrics keep the
    scores as the reward functions gave them). The base class's hook (none) costs nothing."""
    if type(algo).before_train_step is RLAlgorithm.before_train_step:
        return step
    rewards = torch.tensor(step.scores.scores, dtype=torch.float32)
    data = {
        "rewards": rewards,
        "group": torch.arange(len(rewards)) // step.rollout.n,
        **hook_tensors(step.rollout),
        "texts": [s.response for s in step.samples],
        "components": step.scores.components,
    }
    call_hook(algo, "before_train_step", step_no, step_no, data, timeout_s=timeout_s)
    try:
        shaped = torch.as_tensor(data.get("rewards"), dtype=torch.float32).reshape(-1)
    except (TypeError, ValueError, RuntimeError):  # removed, replaced by something that is not numbers
        shaped = torch.empty(0)
    if shaped.shape != rewards.shape or not torch.isfinite(shaped).all():
        raise AlgorithmError(
            f"algorithm {type(algo).__name__}.before_train_step at step {step_no}: "
            f"data['rewards'] must stay {len(rewards)} finite numbers"
        )
    return replace(step, scores=replace(step.scores, scores=shaped.tolist()))


def after_train_step(
    algo: RLAlgorithm, metrics: dict[str, float], step_no: int, timeout_s: float | None = None
) -> dict[str, float]:
    """The algorithm's ``after_train_step`` with the step's metrics; its ``get_metrics`` under ``algorithm/``."""
    call_hook(algo, "after_train_step", step_no, step_no, dict(metrics), timeout_s=timeout_s)
    extra = call_hook(algo, "get_metrics", step_no, timeout_s=timeout_s)
    return {f"algorithm/{k}": v for k, v in checked_metrics(algo, extra, step_no).items()}


def checked_metrics(algo: RLAlgorithm, extra: Any, step_no: int) -> dict[str, float]:
    """``get_metrics``'s result as {name: float}: None is no metrics; anything else but a dict of names to real
    numbers stops the run naming the class and the entry (an infinite or NaN value is logged as it is)."""
    if extra is None:
        return {}
    name = f"algorithm {type(algo).__name__}.get_metrics at step {step_no}"
    if not isinstance(extra, dict):
        raise AlgorithmError(f"{name}: must return a dict of metric names to numbers, got {type(extra).__name__}")
    out = {}
    for k, v in extra.items():
        try:
            if isinstance(v, bool | str | bytes) or not isinstance(k, str):
                raise TypeError(type(v).__name__ if isinstance(k, str) else f"key {type(k).__name__}")
            out[k] = float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
        except (TypeError, ValueError, OverflowError, RuntimeError) as e:
            raise AlgorithmError(f"{name}: {k!r} is not a number ({type(e).__name__}: {e})") from None
    return out
