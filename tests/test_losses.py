"""Every policy loss equals verl 0.9.1's own (``verl.trainer.ppo.core_algos``, run here on the same tensors): the loss,
its gradient with respect to the log-probs, and the metrics, for each aggregation mode and with global batch counts
(micro-batch shares of a mini-batch on several ranks); plus vlmrl's own additions (the dual clip turned off,
``geo_mean`` over the mini-batch) and the worker's use of the convention: micro-batches sum to the big batch's loss."""

from __future__ import annotations

import warnings

import pytest
import torch

from vlmrl.algorithms import losses
from vlmrl.algorithms.losses import LossConfig, PolicyLossSettings, agg_loss, get_policy_loss

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.ppo import core_algos as verl_algos
    from verl.workers.config.actor import ActorConfig as VerlActorConfig
    from verl.workers.config.actor import PolicyLossConfig as VerlPolicyLossConfig

ATOL = 1e-6
MODES = ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo", "dppo_tv", "dppo_kl"]
AGGS = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SETTINGS = dict(clip_ratio=0.2, clip_ratio_low=0.15, clip_ratio_high=0.28, clip_ratio_c=3.0, tau_pos=1.2, tau_neg=1.6)
LOSS_SETTINGS = dict(
    clip_cov_ratio=0.2, clip_cov_lb=-5.0, clip_cov_ub=5.0, kl_cov_ratio=0.2, ppo_kl_coef=0.3, dro_beta=0.05
)
"""Shares large enough that clip_cov and kl_cov touch several tokens of a small batch."""


def verl_config(loss_mode: str, global_batch_info: dict | None = None) -> VerlActorConfig:
    cfg = VerlActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        rollout_n=1,
        policy_loss=VerlPolicyLossConfig(loss_mode=loss_mode, **LOSS_SETTINGS),
        **SETTINGS,
    )
    cfg.global_batch_info.update(global_batch_info or {})
    return cfg


def our_config(loss_mode: str, global_batch_info: dict | None = None) -> LossConfig:
    return LossConfig(
        policy_loss=PolicyLossSettings(loss_mode=loss_mode, **LOSS_SETTINGS),
        global_batch_info=dict(global_batch_info or {}),
        **SETTINGS,
    )


def batch(seed: int, B: int = 5, T: int = 8) -> dict[str, torch.Tensor]:
    """Right-padded responses of different lengths, one with a masked span inside (a tool's output), per-token
    advantages of both signs, log-probs of a policy a few updates away from the old one (ratios near and beyond the
    clip bounds)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    mask[0, 2:4] = 0.0
    old = -torch.rand(B, T, generator=g) * 3.0 - 0.05
    new = old + torch.randn(B, T, generator=g) * 0.25
    adv = torch.randn(B, 1, generator=g).expand(B, T).clone()
    adv[1] = torch.randn(T, generator=g)  # one with per-token advantages (GAE-like)
    return {"old": old, "new": new.clamp(max=-1e-3), "adv": adv, "mask": mask}


def run(fn, b: dict, agg: str, cfg, weights: torch.Tensor | None = None):
    """(loss, d loss / d log_prob, metrics) of one call; the same RNG state for both sides (clip_cov samples)."""
    log_prob = b["new"].clone().requires_grad_(True)
    torch.manual_seed(1234)
    loss, metrics = fn(
        old_log_prob=b["old"],
        log_prob=log_prob,
        advantages=b["adv"],
        response_mask=b["mask"],
        loss_agg_mode=agg,
        config=cfg,
        rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), log_prob.grad, metrics


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agg", AGGS)
def test_each_loss_equals_verls(mode: str, agg: str) -> None:
    for seed in (0, 1):
        b = batch(seed)
        ours = run(get_policy_loss(mode), b, agg, our_config(mode))
        theirs = run(verl_algos.get_policy_loss_fn(mode), b, agg, verl_config(mode))
        torch.testing.assert_close(ours[0], theirs[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours[1], theirs[1], atol=ATOL, rtol=0)
        assert ours[2].keys() == theirs[2].keys(), (ours[2], theirs[2])
        for k in ours[2]:
            assert ours[2][k] == pytest.approx(theirs[2][k], abs=ATOL), (k, ours[2][k], theirs[2][k])
        assert ours[1].abs().sum() > 0, "the loss has no gradient"


@pytest.mark.parametrize("mode", [m for m in MODES if m != "geo_mean"])
def test_global_batch_counts_and_rollout_weights_as_verls(mode: str) -> None:
    """The shares of a mini-batch on 2 ranks (verl's global_batch_info) and rollout-correction weights."""
    b = batch(3)
    w = torch.rand(b["mask"].shape, generator=torch.Generator().manual_seed(5)) + 0.5
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        info = dict(dp_size=2, batch_num_tokens=71.0, global_batch_size=11.0, loss_scale_factor=16)
        ours = run(get_policy_loss(mode), b, agg, our_config(mode, info), w)
        theirs = run(verl_algos.get_policy_loss_fn(mode), b, agg, verl_config(mode, info), w)
        torch.testing.assert_close(ours[0], theirs[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours[1], theirs[1], atol=ATOL, rtol=0)


def test_agg_loss_equals_verls() -> None:
    b = batch(4)
    loss_mat = b["new"] * b["adv"]
    for agg in AGGS:
        for info in ({}, dict(dp_size=3, batch_num_tokens=50.0, global_batch_size=9.0, loss_scale_factor=12)):
            torch.testing.assert_close(
                agg_loss(loss_mat, b["mask"], agg, **info),
                verl_algos.agg_loss(loss_mat, b["mask"], agg, **info),
                atol=ATOL,
                rtol=0,
            )


def test_micro_batches_sum_to_the_big_batch() -> None:
    """What the worker relies on: the micro-batches' losses, each with the mini-batch's global counts, add up to the
    loss of the whole batch in one piece (and so do their gradients)."""
    b = batch(6, B=6)
    for mode in ("vanilla", "gspo", "cispo", "geo_mean"):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            info = dict(dp_size=1, batch_num_tokens=float(b["mask"].sum()), global_batch_size=6.0, loss_scale_factor=8)
            whole = run(get_policy_loss(mode), b, agg, our_config(mode, info))
            parts = [
                run(get_policy_loss(mode), {k: v[s] for k, v in b.items()}, agg, our_config(mode, info))
                for s in (slice(0, 2), slice(2, 6))
            ]
            torch.testing.assert_close(parts[0][0] + parts[1][0], whole[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(torch.cat([parts[0][1], parts[1][1]]), whole[1], atol=ATOL, rtol=0)


def test_dual_clip_off_and_bounds() -> None:
    """clip_ratio_c=0 (vlmrl's way to turn the dual clip off) is the plain clipped surrogate; a bound in (0, 1] is
    refused, as verl refuses it."""
    b = batch(7)
    cfg = our_config("vanilla")
    cfg.clip_ratio_c = 0.0
    loss, _g, metrics = run(losses.vanilla, b, "token-mean", cfg)
    low, high = cfg.clip_bounds()
    ratio = (b["new"] - b["old"]).exp()
    plain = torch.maximum(-b["adv"] * ratio, -b["adv"] * ratio.clamp(1 - low, 1 + high))
    torch.testing.assert_close(loss, (plain * b["mask"]).sum() / b["mask"].sum(), atol=ATOL, rtol=0)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    cfg.clip_ratio_c = 0.5
    with pytest.raises(ValueError, match="clip_ratio_c"):
        run(losses.vanilla, b, "token-mean", cfg)


def test_names_and_refusals() -> None:
    assert get_policy_loss("ppo") is get_policy_loss("vanilla")  # vlmrl's older name
    with pytest.raises(ValueError, match="set algorithm.rollout_correction.bypass_mode=True"):
        run(get_policy_loss("bypass_mode"), batch(0), "token-mean", our_config("bypass_mode"))
    with pytest.raises(ValueError, match="unknown; choose one of"):
        get_policy_loss("gspoo")
    cfg = our_config("dro")
    cfg.policy_loss.dro_beta = None
    with pytest.raises(ValueError, match="dro_beta"):
        run(losses.dro, batch(0), "token-mean", cfg)
    assert set(MODES) | {"bypass_mode"} == set(verl_algos.POLICY_LOSS_REGISTRY), "a verl loss this test misses"


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize(
    "corr",
    [
        dict(rollout_is="token", rollout_is_threshold=2.0),
        dict(
            rollout_is="sequence",
            rollout_is_threshold="0.5_2.0",
            rollout_rs="token_k1",
            rollout_rs_threshold="0.8_1.25",
        ),
        dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.035),
    ],
)
def test_bypass_mode_equals_verls(loss_type: str, corr: dict) -> None:
    """Rollout correction's bypass mode: the old log-probs are the engine's; weights and rejection against the current
    policy inside the loss; PPO clip on the kept tokens or REINFORCE with the weights."""
    from types import SimpleNamespace

    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    full = {
        **dict(
            rollout_is=None,
            rollout_is_threshold=2.0,
            rollout_is_batch_normalize=False,
            rollout_rs=None,
            rollout_rs_threshold=None,
        ),
        **corr,
        "loss_type": loss_type,
    }
    for seed in (0, 1):
        b = batch(seed)
        cfg = our_config("bypass_mode")
        cfg.policy_loss.rollout_correction = SimpleNamespace(**full)
        ours = run(get_policy_loss("bypass_mode"), b, "token-mean", cfg)
        vcfg = VerlActorConfig(
            strategy="fsdp",
            ppo_mini_batch_size=4,
            ppo_micro_batch_size_per_gpu=2,
            rollout_n=1,
            policy_loss=VerlPolicyLossConfig(
                loss_mode="bypass_mode",
                rollout_correction=RolloutCorrectionConfig(
                    **{k: v for k, v in full.items() if k != "loss_type"}, loss_type=loss_type
                ),
            ),
            **SETTINGS,
        )
        theirs = run(verl_algos.get_policy_loss_fn("bypass_mode"), b, "token-mean", vcfg)
        torch.testing.assert_close(ours[0], theirs[0], atol=ATOL, rtol=0)
        torch.testing.assert_close(ours[1], theirs[1], atol=ATOL, rtol=0)
        for k, v in ours[2].items():
            assert v == pytest.approx(float(theirs[2][k]), abs=1e-5), (k, v, theirs[2][k])
        if "rollout_rs" in corr:  # the bounds reject some tokens, not all: the case tests the mask
            assert 0 < ours[2]["rollout_corr/rollout_rs_masked_fraction"] < 1, ours[2]
