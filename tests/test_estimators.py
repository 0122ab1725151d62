"""Every advantage estimator equals verl 0.9.1's own (``verl.trainer.ppo.core_algos``, run here on the same tensors):
advantages and returns, with groups of different sizes (one of a single sample), interleaved prompt ids, a masked
tool span, equal rewards in a group, and per-token rewards (a KL term) as the token path gives them. Then the
sequence path (one advantage per sample from the scores and lengths) against the token form, and the refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from vlmrl.algorithms import estimators
from vlmrl.algorithms.estimators import (
    ADV_ESTIMATORS,
    ESTIMATOR_NEEDS,
    EstimatorConfig,
    get_adv_estimator_fn,
    sequence_advantages,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos as verl_algos

ATOL = 1e-6
VERLS = sorted(set(ADV_ESTIMATORS) - {"dr_grpo"})


def batch(seed: int, B: int = 9, R: int = 7, per_token: bool = False) -> dict:
    """Right-padded responses of different lengths, one with a masked tool span, the score on each last generated
    token (plus a small per-token term when ``per_token``), prompt ids interleaved and of different group sizes."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    mask[0, 2:4] = 0.0
    scores = torch.randint(0, 3, (B,), generator=g).float() + torch.rand(B, generator=g) * (seed % 2)
    rewards = torch.zeros(B, R)
    rewards[torch.arange(B), lengths - 1] = scores
    if per_token:
        rewards = rewards - 0.01 * torch.rand(B, R, generator=g) * mask
    index = np.array(["p2", "p0", "p1", "p0", "p2", "p1", "p0", "p2", "p3"][:B], dtype=object)
    baselines = torch.randint(0, 3, (B,), generator=g).float()
    old = -torch.rand(B, R, generator=g) * 3.0
    pi2 = torch.rand(B, R, generator=g) * 0.5
    is_weights = (torch.rand(B, R, generator=g) + 0.5) if seed % 2 else None
    return {
        "rewards": rewards,
        "mask": mask,
        "index": index,
        "scores": scores,
        "lengths": lengths,
        "baselines": baselines,
        "old": old,
        "pi2": pi2,
        "is_weights": is_weights,
    }


def verl_config(**kw) -> AlgoConfig:
    return AlgoConfig(**kw)


def call(fn, b: dict, cfg, norm: bool = True, **extra):
    kw = dict(token_level_rewards=b["rewards"].clone(), response_mask=b["mask"], index=b["index"], config=cfg, **extra)
    if "reward_baselines" in fn.__code__.co_varnames:  # ReMax: a greedy rollout's reward per sample
        kw["reward_baselines"] = b["baselines"]
    if "sum_pi_squared" in fn.__code__.co_varnames:  # the optimal-token-baseline pair
        kw |= {"old_log_probs": b["old"], "sum_pi_squared": b["pi2"], "rollout_is_weights": b["is_weights"]}
    if "norm_adv_by_std_in_grpo" in fn.__code__.co_varnames:
        kw["norm_adv_by_std_in_grpo"] = norm
    return fn(**kw)


@pytest.mark.parametrize("name", VERLS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("per_token", [False, True])
def test_each_estimator_equals_verls(name: str, norm: bool, per_token: bool) -> None:
    for seed in (0, 1, 2):
        b = batch(seed, per_token=per_token)
        if name == "grpo_passk":  # every prompt needs 2 samples: drop the single one
            b = {k: v[:8] if v is not None else None for k, v in b.items()}
        ours = call(get_adv_estimator_fn(name), b, EstimatorConfig(gamma=0.9, norm_adv_by_std_in_grpo=norm), norm)
        theirs = call(
            verl_algos.get_adv_estimator_fn(name), b, verl_config(gamma=0.9, norm_adv_by_std_in_grpo=norm), norm
        )
        torch.testing.assert_close(ours[0].float(), theirs[0].float(), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours[1].float(), theirs[1].float(), atol=ATOL, rtol=0)


def test_gdpo_with_reward_components_equals_verls() -> None:
    """GDPO normalises each named reward component within its group on its own, weights and sums them."""
    b = batch(3)
    g = torch.Generator().manual_seed(9)
    comps = {
        "format": torch.randint(0, 2, (9,), generator=g).float().tolist(),
        "accuracy": torch.rand(9, generator=g).tolist(),
        "other": [0.0] * 9,
    }
    for weights in (None, [0.3, 2.0]):
        cfg = EstimatorConfig(gdpo_reward_keys=["format", "accuracy"], gdpo_reward_weights=weights)
        ours = call(estimators.gdpo, b, cfg, non_tensor_batch=comps, batch=None)
        # verl reads each sample's last token from the prompt/attention layout of its batch
        P = 3
        attention = torch.cat([torch.ones(9, P), (torch.arange(7)[None, :] < b["lengths"][:, None]).float()], 1).long()
        vb = {"prompts": torch.zeros(9, P), "attention_mask": attention}
        vcfg = verl_config(gdpo_reward_keys=["format", "accuracy"], gdpo_reward_weights=weights)
        theirs = call(
            verl_algos.compute_gdpo_outcome_advantage,
            b,
            vcfg,
            non_tensor_batch={k: np.array(v) for k, v in comps.items()},
            batch=vb,
        )
        torch.testing.assert_close(ours[0], theirs[0], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="'missing' is not a reward component"):
        call(estimators.gdpo, b, EstimatorConfig(gdpo_reward_keys=["missing"]), non_tensor_batch=comps)


@pytest.mark.parametrize("name", sorted(n for n, d in ESTIMATOR_NEEDS.items() if d.sequence_level))
def test_sequence_path_equals_the_token_form(name: str) -> None:
    """What the trainer computes from scores and lengths alone is, per sample, the token form's value on that
    sample's generated tokens (single-turn responses)."""
    b = batch(4)
    b["mask"][0, 2:4] = 1.0  # single turn: no tool span
    b["index"] = np.array([0, 1, 2, 1, 0, 2, 1, 0, 3][:9])
    if name == "grpo_passk":
        b = {k: v[:8] if v is not None else None for k, v in b.items()}
    cfg = EstimatorConfig()
    seq = sequence_advantages(
        name,
        b["scores"],
        torch.as_tensor(b["index"]),
        b["lengths"].float(),
        cfg,
        baselines=b["baselines"].tolist() if name == "remax" else None,
    )
    tok, _ = call(get_adv_estimator_fn(name), b, cfg)
    rows = torch.arange(len(seq))
    torch.testing.assert_close(seq, tok[rows, b["lengths"] - 1].float(), atol=ATOL, rtol=0)
    constant = (tok * b["mask"]).sum(-1) / b["mask"].sum(-1)
    torch.testing.assert_close(constant, tok[rows, b["lengths"] - 1], atol=1e-5, rtol=0)  # one value per sample


def test_hand_computed_examples() -> None:
    """A few values by hand: GRPO (unbiased std), RLOO (mean of the others), OPO (length-weighted baseline), GPG
    (alpha = batch / non-zero rewards), pass@k (only the best learns)."""
    scores = torch.tensor([0.0, 2.0, 4.0, 1.0, 5.0])
    group = torch.tensor([0, 0, 0, 1, 1])
    ones = torch.ones(5)
    close = torch.testing.assert_close
    close(
        sequence_advantages("grpo", scores, group, ones, EstimatorConfig()),
        torch.tensor([-1.0, 0.0, 1.0, -(2**-0.5), 2**-0.5]),
        atol=1e-5,
        rtol=0,
    )
    close(sequence_advantages("rloo", scores, group, ones, EstimatorConfig()), torch.tensor([-3.0, 0, 3, -4, 4]))
    lengths = torch.tensor([1.0, 1.0, 2.0, 3.0, 1.0])  # group 0 baseline (0 + 2 + 8) / 4 = 2.5; group 1 (3 + 5) / 4
    close(
        sequence_advantages("opo", scores, group, lengths, EstimatorConfig()),
        torch.tensor([-2.5, -0.5, 1.5, -1.0, 3.0]),
    )
    close(
        sequence_advantages("gpg", scores, group, ones, EstimatorConfig()),  # alpha 5 / 4
        torch.tensor([-2.5, 0.0, 2.5, -2.5, 2.5]),
    )
    passk = sequence_advantages("grpo_passk", scores, group, ones, EstimatorConfig(norm_adv_by_std_in_grpo=False))
    close(passk, torch.tensor([0.0, 0.0, 2.0, 0.0, 4.0]))


def test_refusals_and_registry() -> None:
    with pytest.raises(ValueError, match="unknown; choose one of"):
        get_adv_estimator_fn("gpro")
    missing = set(verl_algos.ADV_ESTIMATOR_REGISTRY) - set(ADV_ESTIMATORS) - {"gae"}
    assert not missing, f"verl estimators this module does not build: {missing}"
