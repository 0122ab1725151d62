"""Advantage estimators, in verl's calling convention (a file written for verl's ``@register_adv_est`` runs as is).

Every estimator is ``fn(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config,
**kwargs) -> (advantages, returns)``: [B, R] token rewards (a sample's score on its last generated token), its
response mask, ``index`` the prompt (group) id of each sample (a numpy array), ``config`` an
:class:`EstimatorConfig` (verl's ``AlgoConfig`` attribute names). Extra inputs arrive as verl passes them: GDPO gets
``non_tensor_batch`` (each reward component's per-sample values) and ``batch``.

What an estimator needs from the run is declared where it is registered (:class:`Needs`: one advantage per sample
from the scores or per token after the forward, a group of samples per prompt, a critic, a greedy baseline rollout,
the policy's old probabilities, the reward components); the config's checks, the plan and the trainer read the
declaration, never the estimator's name. A user's estimator declares the same way:
``@register_adv_est("mine", needs=Needs(sequence_level=True, group=True))``.

The built-ins are verl 0.9.1's ``core_algos`` estimators, to the same tensors (tests/test_estimators.py runs verl's
own functions beside these): ``grpo``, ``grpo_vectorized``, ``rloo``, ``rloo_vectorized``, ``opo``, ``gpg``,
``grpo_passk``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``gdpo``, ``remax`` (the trainer rolls
out each prompt greedily for its baseline); plus vlmrl's ``dr_grpo`` (GRPO without the std). ``gae`` needs the
critic's values (``vlmrl.algorithms.ppo``); ``optimal_token_baseline`` and ``tir_optimal_token_baseline`` the policy's
old log-probs and the sum of its squared token probabilities (the workers compute them before the advantages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vlmrl.algorithms.core import masked_mean
from vlmrl.algorithms.losses import _Attrs
from vlmrl.userfiles import registered_or_file

EstimatorFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADV_ESTIMATORS: dict[str, EstimatorFn] = {}


@dataclass(frozen=True)
class Needs:
    """What an advantage estimator needs from the run, declared where it is registered
    (``@register_adv_est(name, needs=Needs(...))``; a function loaded from a file may carry a ``needs`` attribute).
    The config's checks, the plan and the trainer read it; none of them compares an estimator's name. The default
    is a user's estimator as verl runs it: per token, after the workers' forward, with gamma and lam in its config."""

    sequence_level: bool = False
    """One advantage per sample from the scores and response lengths alone: the driver computes it before any
    log-prob (the GRPO family). Otherwise per token, after the workers' log-probs, on the real response masks."""
    group: bool = False
    """It compares the samples of a prompt: ``actor_rollout_ref.rollout.n`` >= 2."""
    critic: bool = False
    """The critic's values (as ``values``, [B, R]): the run builds a critic; ``critic.enable=False`` is refused."""
    baseline_rollout: bool = False
    """Each prompt's greedy rollout, scored, as ``reward_baselines`` (the trainer rolls it out beside the batch)."""
    policy_probs: bool = False
    """The policy's old log-probs and the sum of its squared token probabilities (the workers compute them first)."""
    reward_components: bool = False
    """Each reward component's per-sample values, as verl's ``non_tensor_batch`` (and ``batch=None``)."""
    reads: frozenset[str] = field(default_factory=lambda: frozenset({"gamma", "lam"}))
    """The ``algorithm.*`` discounting settings it reads (a setting it does not read gets a notice when set)."""


GROUP_SCORES = Needs(sequence_level=True, group=True, reads=frozenset())
"""The GRPO family's needs: a group of scores per prompt, one advantage per sample."""
ESTIMATOR_NEEDS: dict[str, Needs] = {}
"""Each registered estimator's declared needs (``register_adv_est``)."""
OWN_CONVENTION: dict[str, Needs] = {"gae": Needs(critic=True)}
"""Estimators with a calling convention of their own, outside ``ADV_ESTIMATORS`` (as verl's trainer calls GAE
apart): GAE takes the critic's values (``vlmrl.algorithms.ppo.token_advantages``)."""


def register_adv_est(name: Any, needs: Needs | None = None) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: add an estimator under ``name`` (verl's ``register_adv_est``, drop-in; an Enum's value is used)
    with what it ``needs`` (default: ``Needs()``, per token after the forward, as verl runs any estimator)."""
    key = getattr(name, "value", name)

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if key in ADV_ESTIMATORS and ADV_ESTIMATORS[key] is not fn:  # as verl's decorator
            raise ValueError(
                f"advantage estimator {key!r} is already registered ({ADV_ESTIMATORS[key].__module__}."
                f"{ADV_ESTIMATORS[key].__name__}): choose another name"
            )
        ADV_ESTIMATORS[key] = fn
        ESTIMATOR_NEEDS[key] = needs or Needs()
        return fn

    return deco


def estimator_needs(name: str) -> Needs:
    """What ``name`` needs: its declaration (registered, of its own convention, or a file's function's ``needs``
    attribute); raises as ``get_adv_estimator_fn`` does for a name that is none of them."""
    if name in OWN_CONVENTION:
        return OWN_CONVENTION[name]
    fn = get_adv_estimator_fn(name)
    if ADV_ESTIMATORS.get(name) is fn and name in ESTIMATOR_NEEDS:
        return ESTIMATOR_NEEDS[name]
    return getattr(fn, "needs", None) or Needs()


def get_adv_estimator_fn(name: str) -> EstimatorFn:
    """A registered estimator, or ``path/to/file.py:fn`` loaded from a file."""
    return registered_or_file(ADV_ESTIMATORS, name, "algorithm.adv_estimator", [*ADV_ESTIMATORS, *OWN_CONVENTION])


@dataclass
class EstimatorConfig(_Attrs):
    """What an estimator reads from ``config``: verl's ``AlgoConfig`` attribute names."""

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None

    @classmethod
    def from_algorithm(cls, alg: Any) -> EstimatorConfig:
        """From vlmrl's ``AlgorithmConfig``."""
        return cls(
            gamma=alg.gamma,
            lam=alg.lam,
            adv_estimator=alg.adv_estimator,
            norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo,
            gdpo_reward_keys=list(alg.gdpo_reward_keys) if alg.gdpo_reward_keys else None,
            gdpo_reward_weights=list(alg.gdpo_reward_weights) if alg.gdpo_reward_weights else None,
        )


# ------------------------------------------------------------------------------------------------- helpers


def _groups(index: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(group number of each sample, samples per group) from any ids (numpy strings or ints, a tensor)."""
    ids = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    inv = torch.as_tensor(np.unique(ids, return_inverse=True)[1].reshape(-1), device=device)
    return inv, torch.bincount(inv)


def _group_mean_std(scores: torch.Tensor, inv: torch.Tensor, counts: torch.Tensor):
    """Per sample: its group's mean and unbiased std; a group of one has mean 0 and std 1 (verl's convention)."""
    sums = torch.zeros(len(counts), dtype=scores.dtype, device=scores.device).index_add_(0, inv, scores)
    mean = sums / counts
    sq = torch.zeros_like(sums).index_add_(0, inv, (scores - mean[inv]) ** 2)
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inv], std[inv]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) over the masked positions, the variance unbiased (verl's ``masked_whiten``)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    n = mask.sum()
    if n == 0:
        raise ValueError("whitening needs at least one response token")
    var = var * n / (n - 1) if n > 1 else var
    return (values - mean) * torch.rsqrt(var + 1e-8)


# ---------------------------------------------------------------------------------------------- estimators


@register_adv_est("grpo", needs=GROUP_SCORES)
def grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None, **kwargs):
    """GRPO: (r - group mean) / (group std + eps), or without the std (``norm_adv_by_std_in_grpo=False``)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        inv, counts = _groups(index, scores.device)
        mean, std = _group_mean_std(scores, inv, counts)
        adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("grpo_vectorized", needs=GROUP_SCORES)
def grpo_vectorized(
    token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None, **kwargs
):
    """verl's loop-free GRPO: the same numbers as ``grpo`` (vlmrl's ``grpo`` has no loop either)."""
    return grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config)


@register_adv_est("dr_grpo", needs=GROUP_SCORES)
def dr_grpo(
    token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None, **kwargs
):
    """Dr. GRPO: r - group mean, never divided by the std (pair with loss_agg_mode=seq-mean-token-sum-norm)."""
    return grpo(token_level_rewards, response_mask, index, epsilon, False, config)


@register_adv_est("rloo", needs=GROUP_SCORES)
def rloo(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """RLOO: r minus the mean of the group's other samples = n / (n - 1) (r - mean); a group of one keeps r."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        inv, counts = _groups(index, scores.device)
        mean, _ = _group_mean_std(scores, inv, counts)
        n = counts[inv].to(scores.dtype)
        adv = torch.where(n > 1, scores * n / (n - 1) - mean * n / (n - 1), scores)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("rloo_vectorized", needs=GROUP_SCORES)
def rloo_vectorized(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """RLOO without a Python loop (verl's second implementation: a group of one gets 0)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        inv, counts = _groups(index, scores.device)
        c = counts[inv].to(scores.dtype)
        sums = torch.zeros(len(counts), dtype=scores.dtype, device=scores.device).index_add_(0, inv, scores)
        adv = ((c * scores - sums[inv]) / (c - 1).clamp_min(1)) * (c > 1)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("opo", needs=GROUP_SCORES)
def opo(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """OPO: r minus the group's length-weighted mean reward (the optimal baseline for on-policy RL)."""
    with torch.no_grad():
        lengths = response_mask.sum(dim=-1).to(token_level_rewards.dtype)
        scores = token_level_rewards.sum(dim=-1)
        inv, counts = _groups(index, scores.device)
        num = torch.zeros(len(counts), dtype=scores.dtype, device=scores.device).index_add_(0, inv, lengths * scores)
        den = torch.zeros_like(num).index_add_(0, inv, lengths)
        baseline = torch.where(counts > 1, num / den, torch.zeros_like(num))[inv]
        adv = (scores - baseline).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("gpg", needs=GROUP_SCORES)
def gpg(token_level_rewards, response_mask, index, epsilon=1e-6, f_norm=1.0, alpha=1.0, config=None, **kwargs):
    """GPG: alpha (r - group mean) / f_norm with alpha = batch size / samples with a non-zero reward."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
        inv, counts = _groups(index, scores.device)
        mean, _ = _group_mean_std(scores, inv, counts)
        adv = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("grpo_passk", needs=GROUP_SCORES)
def grpo_passk(
    token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None, **kwargs
):
    """Pass@k: only each group's best sample learns, by its margin over the second best (over the group's std)."""
    if config is not None:
        norm_adv_by_std_in_grpo = config.get("norm_adv_by_std_in_grpo", True)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        adv = torch.zeros_like(scores)
        inv, counts = _groups(index, scores.device)
        for g in range(len(counts)):
            rows = torch.nonzero(inv == g, as_tuple=True)[0]
            r = scores[rows]
            if r.numel() < 2:
                raise ValueError(f"grpo_passk needs at least 2 samples per prompt, got {r.numel()}")
            top, top_idx = torch.topk(r, 2)
            a = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                a = a / (torch.std(r) + epsilon)
            adv[rows[top_idx[0]]] = a
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est("reinforce_plus_plus", needs=Needs())  # per token: its discounting needs the tokens
def reinforce_plus_plus(token_level_rewards, response_mask, config=None, **kwargs):
    """REINFORCE++: discounted returns (``gamma``), whitened over the batch's response tokens."""
    gamma = config.gamma if config is not None else 1.0
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            m = response_mask[:, t]
            new = token_level_rewards[:, t] + gamma * running
            returns[:, t] = new * m
            running = new * m + running * (1 - m)
        adv = masked_whiten(returns, response_mask) * response_mask
    return adv, returns


@register_adv_est("remax", needs=Needs(sequence_level=True, baseline_rollout=True, reads=frozenset()))
def remax(token_level_rewards, reward_baselines, response_mask, config=None, **kwargs):
    """ReMax: the return (reward-to-go) minus the reward of the prompt's greedy rollout (``reward_baselines`` [B])."""
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        adv = returns - reward_baselines.unsqueeze(-1) * response_mask
    return adv, returns


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


def _path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask):
    """Cumulative path-variance weights: sum over t' <= t of (1 - 2 pi_t' + sum_a pi(a)^2) (times the squared IS
    weights)."""
    w = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights**2
    return (w * response_mask).cumsum(dim=-1)


def _zero_tail(baselines, rows, lengths, trajectories) -> None:
    """Where one trajectory of a group is strictly the longest, its steps past the second longest get baseline 0."""
    sorted_lengths, _ = torch.sort(lengths)
    longest, second = int(sorted_lengths[-1]), int(sorted_lengths[-2])
    at = (lengths == longest).nonzero(as_tuple=True)[0]
    if at.numel() == 1 and longest > second:
        baselines[trajectories[int(at[0])], second:] = 0.0


@register_adv_est("optimal_token_baseline", needs=Needs(policy_probs=True))
def optimal_token_baseline(
    token_level_rewards,
    response_mask,
    index,
    old_log_probs,
    sum_pi_squared,
    rollout_is_weights=None,
    handle_zero_tail=True,
    epsilon=1e-8,
    **kwargs,
):
    """Optimal token baseline: per step t, the group's reward-to-go weighted by each trajectory's cumulative path
    variance (``_path_weights``), as baseline of that step."""
    with torch.no_grad():
        returns = _reward_to_go(token_level_rewards, response_mask)
        w_cum = _path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask)
        inv, counts = _groups(index, returns.device)
        baselines = torch.zeros_like(returns)
        for g in range(len(counts)):
            trajectories = torch.nonzero(inv == g, as_tuple=True)[0]
            if len(trajectories) == 1:
                continue
            m = response_mask[trajectories]
            b = (returns[trajectories] * w_cum[trajectories] * m).sum(dim=0) / (
                (w_cum[trajectories] * m).sum(dim=0) + epsilon
            )
            baselines[trajectories] = b.unsqueeze(0).expand(len(trajectories), -1)
            if handle_zero_tail:
                _zero_tail(baselines, trajectories, m.sum(dim=-1), trajectories.tolist())
        adv = (returns - baselines) * response_mask
    return adv, returns


@register_adv_est("tir_optimal_token_baseline", needs=Needs(policy_probs=True))
def tir_optimal_token_baseline(
    token_level_rewards,
    response_mask,
    index,
    old_log_probs,
    sum_pi_squared,
    rollout_is_weights=None,
    handle_zero_tail=True,
    epsilon=1e-8,
    **kwargs,
):
    """The optimal token baseline for multi-turn, tool-interleaved responses: steps are the generated tokens only
    (tool outputs, masked, are skipped), aligned by their order among a trajectory's generated tokens."""
    with torch.no_grad():
        returns = _reward_to_go(token_level_rewards, response_mask)
        w_cum = _path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, response_mask)
        lengths = response_mask.sum(dim=-1).to(dtype=torch.long)
        T = int(lengths.max()) if lengths.numel() else 0
        w_steps = w_cum.new_zeros((len(lengths), T))
        r_steps = torch.zeros_like(w_steps)
        for i in range(len(lengths)):
            if lengths[i] > 0:
                keep = response_mask[i].bool()
                w_steps[i, : lengths[i]] = w_cum[i, keep]
                r_steps[i, : lengths[i]] = returns[i, keep]
        ids = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        groups: dict[Any, list[int]] = {}
        for i in range(len(lengths)):
            if lengths[i] > 0:
                groups.setdefault(ids[i], []).append(i)
        baselines = torch.zeros_like(r_steps)
        for members in groups.values():
            rows = torch.tensor(members, device=r_steps.device)
            if len(members) == 1:
                baselines[rows[0]] = 0.0
                continue
            b = (r_steps[rows] * w_steps[rows]).sum(dim=0) / (w_steps[rows].sum(dim=0) + epsilon)
            baselines[rows] = b.to(baselines.dtype)
            if handle_zero_tail:
                _zero_tail(baselines, rows, lengths[rows], members)
        adv_steps = r_steps - baselines
        adv = torch.zeros_like(returns)
        for i in range(len(lengths)):
            if lengths[i] > 0:
                adv[i, response_mask[i].bool()] = adv_steps[i, : lengths[i]]
        adv = adv * response_mask
    return adv, returns


@register_adv_est("reinforce_plus_plus_baseline", needs=GROUP_SCORES)
def reinforce_plus_plus_baseline(token_level_rewards, response_mask, index, epsilon=1e-6, config=None, **kwargs):
    """REINFORCE++ with a baseline: r - group mean on every response token, whitened over the batch's tokens."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        inv, counts = _groups(index, scores.device)
        mean, _ = _group_mean_std(scores, inv, counts)
        adv = (scores - mean).unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
        adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@register_adv_est("gdpo", needs=Needs(sequence_level=True, group=True, reward_components=True, reads=frozenset()))
def gdpo(
    token_level_rewards,
    response_mask,
    index,
    epsilon=1e-6,
    norm_adv_by_std_in_grpo=True,
    config=None,
    non_tensor_batch=None,
    batch=None,
    **kwargs,
):
    """GDPO: each reward component (``algorithm.gdpo_reward_keys``) normalised within its group on its own (GRPO),
    then weighted (``gdpo_reward_weights``), summed and whitened over the batch's tokens. Without keys: the total."""
    scores_list, weights = [token_level_rewards], None
    keys = config.get("gdpo_reward_keys", None) if config is not None else None
    if keys and non_tensor_batch is not None:
        positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
        last = ((response_mask > 0) * positions).amax(dim=-1)  # each sample's last generated token
        rows = torch.arange(response_mask.shape[0], device=response_mask.device)
        scores_list = []
        for key in keys:
            if key not in non_tensor_batch:
                raise ValueError(
                    f"algorithm.gdpo_reward_keys: {key!r} is not a reward component "
                    f"(components: {sorted(non_tensor_batch)})"
                )
            comp = torch.zeros_like(response_mask, dtype=torch.float32)
            comp[rows, last] = torch.tensor(np.asarray(non_tensor_batch[key], dtype=np.float32), device=comp.device)
            scores_list.append(comp)
        if config.get("gdpo_reward_weights", None) is not None:
            weights = list(config.get("gdpo_reward_weights"))
    w = torch.tensor(weights if weights is not None else [1.0] * len(scores_list), dtype=torch.float32)
    total = None
    for i, s in enumerate(scores_list):
        part, _ = grpo(s, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config)
        total = w[i] * part if total is None else total + w[i] * part
    adv = masked_whiten(total, response_mask) * response_mask
    return adv, adv


# --------------------------------------------------------------------------------------- the trainer's use


def extra_inputs(
    name: str,
    dtype: torch.dtype,
    components: dict[str, list[float]] | None = None,
    baselines: list[float] | None = None,
    old_logprobs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The keyword arguments verl passes some estimators beyond the token rewards: GDPO the reward ``components`` (as
    ``non_tensor_batch``), ReMax the ``baselines``, the optimal-token-baseline pair the old log-probs and the sum of
    squared token probabilities, an estimator that declares a critic the critic's ``values`` (vlmrl's rollout-correction
    weights come later, in the update, so none reach them; verl passes its decoupled weights when they are on)."""
    kwargs: dict[str, Any] = {}
    needs = estimator_needs(name)
    if needs.reward_components:
        kwargs = {"non_tensor_batch": components or {}, "batch": None}
    if baselines is not None:  # ReMax: each sample's greedy-rollout reward
        kwargs["reward_baselines"] = torch.tensor(baselines, dtype=dtype)
    if needs.policy_probs:
        if old_logprobs is None or sum_pi_squared is None:
            raise ValueError(
                f"algorithm.adv_estimator={name} needs the policy's old log-probs and sum of squared "
                "token probabilities"
            )
        kwargs |= {"old_log_probs": old_logprobs, "sum_pi_squared": sum_pi_squared, "rollout_is_weights": None}
    if needs.critic:
        kwargs["values"] = values
    return kwargs


def checked(name: str, out: Any, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """An estimator's ``(advantages, returns)``, checked: a pair of [B, R] tensors of ``shape``, all finite."""
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise ValueError(
            f"advantage estimator {name!r} must return (advantages, returns) tensors, got {type(out).__name__}"
        )
    for what, t in zip(("advantages", "returns"), out):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"advantage estimator {name!r} returned {what} of shape {tuple(t.shape)}, expected "
                f"{shape} (token rewards' shape)"
            )
        if not torch.isfinite(t).all():
            raise FloatingPointError(f"advantage estimator {name!r} produced NaN/inf {what}")
    return out


def sequence_advantages(
    name: str,
    scores: torch.Tensor,
    group: torch.Tensor,
    lengths: torch.Tensor,
    config: EstimatorConfig,
    components: dict[str, list[float]] | None = None,
    baselines: list[float] | None = None,
) -> torch.Tensor:
    """One advantage per sample for a sequence-level estimator (``Needs.sequence_level``): its token form run on each
    score placed on the sample's last generated token (``lengths`` of them), read back per sample; raises if any is
    NaN/inf."""
    B = len(scores)
    L = max(int(lengths.max()) if B else 1, 1)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).to(torch.float64)
    last = (lengths.long() - 1).clamp(min=0)
    rewards = torch.zeros(B, L, dtype=torch.float64)  # float64 until the end, as vlmrl always computed them
    rewards[torch.arange(B), last] = scores.to(torch.float64)
    # a sample without generated tokens still counts in its group; its advantage is read where a token would be
    read_mask = mask.clone()
    read_mask[torch.arange(B), last] = 1.0
    fn = get_adv_estimator_fn(name)
    kwargs = extra_inputs(name, torch.float64, components, baselines)
    out = fn(
        token_level_rewards=rewards,
        response_mask=read_mask,
        index=group.numpy(),
        epsilon=1e-6,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
        config=config,
        **kwargs,
    )
    adv, _ = checked(name, out, (B, L))
    return adv[torch.arange(B), last].float()


def compute_advantages(
    name: str,
    scores: torch.Tensor,
    group: torch.Tensor,
    *,
    norm_by_std: bool = True,
    response_lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sequence_advantages`` with the other settings at their defaults (one token per sample when no lengths)."""
    lengths = response_lengths if response_lengths is not None else torch.ones(len(scores))
    return sequence_advantages(name, scores, group, lengths, EstimatorConfig(norm_adv_by_std_in_grpo=norm_by_std))
