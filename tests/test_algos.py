"""vlmrl.algorithms on hand-computed examples: advantage estimators, the PPO loss (``losses.vanilla``), loss
aggregation, KL, registries."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vlmrl.algorithms import estimators
from vlmrl.algorithms.core import aggregate, kl_penalty
from vlmrl.algorithms.estimators import compute_advantages
from vlmrl.algorithms.estimators import get_adv_estimator_fn as get_advantage_fn
from vlmrl.algorithms.losses import LossConfig, get_policy_loss, vanilla


def ppo_loss(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.2, clip_c=3.0, agg="token-mean", **batch_info):
    """``losses.vanilla`` called as the policy worker calls it: (loss, clip fraction, approx KL)."""
    cfg = LossConfig(
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
        global_batch_info=batch_info,
    )
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logp)
    loss, m = vanilla(old, logp, adv, mask, agg, cfg)
    return SimpleNamespace(loss=loss, clip_frac=m["actor/pg_clipfrac"], approx_kl=m["actor/ppo_kl"])


def T(*values: float | list[float]) -> torch.Tensor:
    """A float64 tensor (exact enough to compare hand-computed values tightly)."""
    return torch.tensor(list(values), dtype=torch.float64)


def close(actual: torch.Tensor | float, expected: object, atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# ------------------------------------------------------------------------------------------------------ advantages


def test_grpo_normalises_by_unbiased_group_std():
    # group 0 = [0, 2, 4]: mean 2, unbiased var ((-2)^2 + 0 + 2^2) / (3 - 1) = 4, std 2 -> [-1, 0, 1]
    # group 1 = [1, 3]:    mean 2, unbiased var (1 + 1) / 1 = 2, std sqrt(2) -> [-1/sqrt2, 1/sqrt2]
    # (a biased std would give 1.633 for group 0, i.e. +-1.22)
    scores = torch.tensor([0.0, 2.0, 4.0, 1.0, 3.0])
    group = torch.tensor([0, 0, 0, 1, 1])
    adv = compute_advantages("grpo", scores, group)
    assert adv.dtype == torch.float32 and adv.shape == (5,)
    close(adv, [-1.0, 0.0, 1.0, -0.70710678, 0.70710678], atol=1e-5)


def test_grpo_eps_is_added_to_std():
    # group [0, 2, 4]: std 2; with epsilon = 1 the divisor is 3 -> [-2/3, 0, 2/3]
    fn = get_advantage_fn("grpo")
    adv, _ = fn(T(0, 2, 4)[:, None], torch.ones(3, 1), [0, 0, 0], epsilon=1.0)
    close(adv[:, 0], [-2 / 3, 0.0, 2 / 3])


def test_grpo_without_std_norm_is_mean_centred_only():
    # norm_adv_by_std_in_grpo=False: [0, 2, 4] - 2 = [-2, 0, 2]; [10, 20] - 15 = [-5, 5]
    scores = torch.tensor([0.0, 2.0, 4.0, 10.0, 20.0])
    group = torch.tensor([0, 0, 0, 1, 1])
    adv = compute_advantages("grpo", scores, group, norm_by_std=False)
    close(adv, [-2.0, 0.0, 2.0, -5.0, 5.0])


def test_dr_grpo_groups_by_id_not_position():
    # interleaved groups: group 0 = [0, 2] (mean 1), group 1 = [10, 20] (mean 15); never divided by the std
    scores = torch.tensor([0.0, 10.0, 2.0, 20.0])
    group = torch.tensor([0, 1, 0, 1])
    close(compute_advantages("dr_grpo", scores, group), [-1.0, -5.0, 1.0, 5.0])
    # norm_by_std=True is ignored by dr_grpo
    close(compute_advantages("dr_grpo", scores, group, norm_by_std=True), [-1.0, -5.0, 1.0, 5.0])


def test_rloo_is_score_minus_mean_of_the_others():
    # [0, 2, 4]: 0 - (2 + 4)/2 = -3; 2 - (0 + 4)/2 = 0; 4 - (0 + 2)/2 = 3
    # [1, 5]:    1 - 5 = -4; 5 - 1 = 4
    scores = torch.tensor([0.0, 2.0, 4.0, 1.0, 5.0])
    group = torch.tensor([0, 0, 0, 1, 1])
    close(compute_advantages("rloo", scores, group), [-3.0, 0.0, 3.0, -4.0, 4.0])


def test_rloo_keeps_the_score_of_a_group_of_one():
    # verl's convention (the config check refuses rollout.n=1 for group estimators before any run)
    close(compute_advantages("rloo", torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1])), [1.0, -1.0, 1.0])


def test_reinforce_plus_plus_whitens_over_the_batch_not_the_group():
    # scores [0, 0, 2, 2], one token each: batch mean 1, unbiased std sqrt(4/3) -> +-0.866
    # (each group is constant, so a per-group estimator would give zeros)
    scores = torch.tensor([0.0, 0.0, 2.0, 2.0])
    group = torch.tensor([0, 0, 1, 1])
    adv, _ = get_advantage_fn("reinforce_plus_plus")(
        scores[:, None], torch.ones(4, 1), config=estimators.EstimatorConfig()
    )
    close(adv[:, 0], [-0.8660254, -0.8660254, 0.8660254, 0.8660254], atol=1e-5)
    close(compute_advantages("grpo", scores, group), [0.0, 0.0, 0.0, 0.0])


GROUP = sorted(n for n, d in estimators.ESTIMATOR_NEEDS.items() if d.group and n != "grpo_passk")


@pytest.mark.parametrize("name", GROUP)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_all_equal_scores_give_zero_advantage(name: str, norm_by_std: bool):
    # std 0 in every group: zero advantages, never NaN from 0 / 0
    scores = torch.tensor([0.7, 0.7, 0.7, 0.7, 0.7, 0.7])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = compute_advantages(name, scores, group, norm_by_std=norm_by_std)
    assert torch.isfinite(adv).all()
    close(adv, [0.0] * 6)


# ---------------------------------------------------------------------------------------------------- PPO loss

LOW, HIGH = 0.2, 0.28  # DAPO clip-higher: ratio range [0.8, 1.28]


def one_token(ratio: float, adv: float, **kw: float) -> SimpleNamespace:
    """ppo_loss on a single token whose new/old probability ratio is ``ratio``."""
    old = T([-1.0])
    logp = old + math.log(ratio)
    return ppo_loss(logp, old, T(adv), torch.ones(1, 1), **kw)


@pytest.mark.parametrize(
    "ratio, adv, kw, loss, clipped",
    [
        # positive advantage: the upper bound is 1 + clip_ratio_high
        (1.5, 1.0, dict(clip_low=LOW, clip_high=HIGH), -1.28, 1.0),  # above 1.28: clipped to -A * 1.28
        (1.25, 1.0, dict(clip_low=LOW, clip_high=HIGH), -1.25, 0.0),  # between 1.2 and 1.28: not clipped
        (1.25, 1.0, dict(clip_low=LOW, clip_high=LOW), -1.2, 1.0),  # same token, symmetric 0.2: clipped
        (0.5, 1.0, dict(clip_low=LOW, clip_high=HIGH), -0.5, 0.0),  # ratio below 1 - low: pessimistic, unclipped
        (5.0, 2.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=3.0), -2.56, 1.0),  # no dual clip for A > 0: -2 * 1.28
        # negative advantage: the lower bound is 1 - clip_ratio_low
        (0.5, -1.0, dict(clip_low=LOW, clip_high=HIGH), 0.8, 1.0),  # clipped up to -A * 0.8
        (0.75, -1.0, dict(clip_low=LOW, clip_high=HIGH), 0.8, 1.0),  # 0.75 < 0.8: clipped
        (0.75, -1.0, dict(clip_low=0.3, clip_high=HIGH), 0.75, 0.0),  # 0.75 > 0.7: not clipped
        (1.5, -1.0, dict(clip_low=LOW, clip_high=HIGH), 1.5, 0.0),  # above 1 + high: max() keeps the larger 1.5
        # dual clip: for A < 0 the loss is capped at -A * clip_c
        (5.0, -1.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=3.0), 3.0, 0.0),  # min(5, 3)
        (5.0, -2.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=3.0), 6.0, 0.0),  # min(10, 6)
        (2.0, -1.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=3.0), 2.0, 0.0),  # 2 < 3: untouched
        (5.0, -1.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=10.0), 5.0, 0.0),  # 5 < 10: untouched
        (5.0, -1.0, dict(clip_low=LOW, clip_high=HIGH, clip_c=0.0), 5.0, 0.0),  # clip_c = 0 disables it
    ],
)
def test_ppo_token_loss_and_clip(ratio: float, adv: float, kw: dict, loss: float, clipped: float):
    out = one_token(ratio, adv, **kw)
    close(out.loss, loss)
    close(out.clip_frac, clipped)


def test_ppo_batch_loss_clip_frac_and_approx_kl_ignore_padding():
    # row 0 (A = +1) ratios [1.5, 1.25, 0.5] -> losses [-1.28, -1.25, -0.5], clipped [1, 0, 0]
    # row 1 (A = -1) ratios [0.5, 1.5, 5.0, pad] -> losses [0.8, 1.5, 3.0 (dual clip)], clipped [1, 0, 0]
    # token-mean over the 6 real tokens: (-3.03 + 5.3) / 6 = 2.27 / 6; clip_frac 2 / 6
    # approx_kl = mean(-log ratio) = -(ln 1.5 + ln 1.25 + ln 0.5 + ln 0.5 + ln 1.5 + ln 5) / 6 = -ln(3.515625) / 6
    old = torch.full((2, 4), -2.0, dtype=torch.float64)
    ratios = torch.tensor([[1.5, 1.25, 0.5, 1.0], [0.5, 1.5, 5.0, 1e6]], dtype=torch.float64)
    logp = old + ratios.log()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    out = ppo_loss(logp, old, T(1.0, -1.0), mask, clip_low=LOW, clip_high=HIGH, clip_c=3.0)
    close(out.loss, 2.27 / 6)
    close(out.clip_frac, 2 / 6)
    close(out.approx_kl, -1.2572173 / 6)  # ln(3.515625) = 1.2572173


def test_ppo_token_level_advantages():
    # adv [B, T] used as is: ratio 1 everywhere, so the per-token loss is -A: token-mean (-1 + 2 - 3 + 0.5) / 4
    logp = torch.zeros(2, 2, dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0], [3.0, -0.5]], dtype=torch.float64)
    out = ppo_loss(logp, logp, adv, torch.ones(2, 2))
    close(out.loss, (-1 + 2 - 3 + 0.5) / 4)
    close(out.clip_frac, 0.0)
    close(out.approx_kl, 0.0)


@pytest.mark.parametrize(
    "agg, kw, expected",
    [
        # per-token loss -A with ratio 1: row 0 (A=+1, 3 tokens) -1 each, row 1 (A=-1, 1 token) +1
        ("token-mean", {}, (-3 + 1) / 4),
        ("seq-mean-token-mean", {}, (-1 + 1) / 2),
        ("seq-mean-token-sum-norm", dict(loss_scale_factor=4), (-3 / 4 + 1 / 4) / 2),
        ("token-mean", dict(batch_num_tokens=8.0), (-3 + 1) / 8),
        ("token-mean", dict(dp_size=2, batch_num_tokens=8.0), 2 * (-3 + 1) / 8),  # a share of 2 ranks' batch
    ],
)
def test_ppo_loss_passes_the_aggregation_through(agg: str, kw: dict, expected: float):
    logp = torch.full((2, 4), -1.0, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    out = ppo_loss(logp, logp.clone(), T(1.0, -1.0), mask, agg=agg, **kw)
    close(out.loss, expected)


def test_ppo_gradient_is_zero_exactly_on_clipped_tokens():
    # d(-A r)/d logp = -A r for an unclipped token (r = exp(logp - old)); 0 where clip or dual clip hold it constant.
    # token-mean over 6 real tokens divides each by 6; the padded token gets no gradient.
    old = torch.full((2, 4), -2.0, dtype=torch.float64)
    ratios = torch.tensor([[1.5, 1.25, 0.5, 1.0], [0.5, 1.5, 5.0, 1.0]], dtype=torch.float64)
    logp = (old + ratios.log()).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    out = ppo_loss(logp, old, T(1.0, -1.0), mask, clip_low=LOW, clip_high=HIGH, clip_c=3.0)
    out.loss.backward()
    expected = [
        [0.0, -1.25 / 6, -0.5 / 6, 0.0],  # 1.5 clipped at 1.28; 1.25 and 0.5 (A > 0) unclipped
        [0.0, 1.5 / 6, 0.0, 0.0],  # 0.5 clipped at 0.8; 1.5 unclipped; 5.0 dual-clipped at 3
    ]
    close(logp.grad, expected, atol=1e-9)
    clipped = torch.tensor([[1, 0, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)
    assert (logp.grad[clipped] == 0).all()
    assert (logp.grad[~clipped & mask.bool()] != 0).all()


# ------------------------------------------------------------------------------------------------- aggregation

# row 0 has 4 real tokens, row 1 has 2; the padding holds 1000 so any leak shows
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 1000.0, 1000.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])


@pytest.mark.parametrize(
    "mode, kw, expected",
    [
        ("token-mean", {}, (1 + 2 + 3 + 4 + 10 + 20) / 6),  # 40 / 6
        ("seq-mean-token-mean", {}, (10 / 4 + 30 / 2) / 2),  # (2.5 + 15) / 2 = 8.75
        ("seq-mean-token-sum-norm", {}, (10 / 4 + 30 / 4) / 2),  # max_len defaults to the width 4: 5.0
        ("seq-mean-token-sum-norm", dict(max_len=8), (10 / 8 + 30 / 8) / 2),  # constant divisor 8: 2.5
        ("token-mean", dict(global_tokens=12.0), 40 / 12),  # mini-batch token count replaces the local 6
        ("seq-mean-token-mean", dict(global_seqs=4.0), (2.5 + 15) / 4),
        ("seq-mean-token-sum-norm", dict(global_seqs=4.0, max_len=8), (10 / 8 + 30 / 8) / 4),
    ],
)
def test_aggregate_modes_with_padding(mode: str, kw: dict, expected: float):
    close(aggregate(LOSS, MASK, mode, **kw), expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregate_micro_batches_with_global_counts_add_up_to_the_big_batch(mode: str):
    # the two rows as two micro-batches, each given the whole batch's counts (6 tokens, 2 sequences, max_len 4)
    kw = dict(global_tokens=6.0, global_seqs=2.0, max_len=4)
    parts = sum(aggregate(LOSS[i : i + 1], MASK[i : i + 1], mode, **kw) for i in range(2))
    expected = {"token-mean": 40 / 6, "seq-mean-token-mean": 8.75, "seq-mean-token-sum-norm": 5.0}[mode]
    close(parts, expected)


def test_aggregate_fully_masked_row_is_zero_not_nan():
    # row 1 has no real token: seq-mean-token-mean counts it as a 0-loss sequence, (10/4 + 0) / 2
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    close(aggregate(LOSS, mask, "seq-mean-token-mean"), 1.25)
    close(aggregate(LOSS, mask, "token-mean"), 2.5)
    close(aggregate(LOSS, torch.zeros(2, 4), "token-mean"), 0.0)


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError, match="loss_agg_mode='seq-mean-token-sum'"):
        aggregate(LOSS, MASK, "seq-mean-token-sum")


# ---------------------------------------------------------------------------------------------------------- KL

# logp - ref = d = [0.5, -1.0, 0.0]
LOGP = T(-1.0, -2.0, -0.3)
REF = T(-1.5, -1.0, -0.3)


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("k1", [0.5, -1.0, 0.0]),  # d
        ("kl", [0.5, -1.0, 0.0]),  # verl's alias of k1
        ("abs", [0.5, 1.0, 0.0]),  # |d|
        ("k2", [0.125, 0.5, 0.0]),  # d^2 / 2
        ("mse", [0.125, 0.5, 0.0]),  # verl's alias of k2
        # k3 with r = ref - logp = [-0.5, 1, 0]: e^r - r - 1 = [0.60653066 - 0.5, 2.71828183 - 2, 0]
        ("low_var_kl", [0.10653066, 0.71828183, 0.0]),
        ("k3", [0.10653066, 0.71828183, 0.0]),  # verl's alias of low_var_kl
    ],
)
def test_kl_estimators(kind: str, expected: list[float]):
    close(kl_penalty(LOGP, REF, kind), expected, atol=1e-7)


def test_low_var_kl_is_clamped_to_10():
    # r = ref - logp = [3, 30, -30, -12]: e^3 - 4 = 16.09 -> 10; e^20 - 21 (r clamped to 20) -> 10;
    # e^-20 + 20 - 1 (r clamped to -20) = 19 -> 10; e^-12 + 12 - 1 = 11.000006 -> 10. Finite everywhere.
    ref = T(0.0, 0.0, -30.0, -12.0)
    logp = T(-3.0, -30.0, 0.0, 0.0)
    out = kl_penalty(logp, ref, "low_var_kl")
    close(out, [10.0, 10.0, 10.0, 10.0])
    # just inside the clamp: r = -10 -> e^-10 + 9 = 9.0000454
    close(kl_penalty(T(0.0), T(-10.0), "k3"), [9.0000454], atol=1e-6)


def test_kl_unknown_kind():
    with pytest.raises(ValueError, match="kl_loss_type='full'"):
        kl_penalty(LOGP, REF, "full")


# ---------------------------------------------------------------------------------------------------- registries


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_advantage_estimator_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # the documented form: algorithm.adv_estimator=path/to/my_algo.py:fn (verl's signature), relative to the working
    # directory; here a per-token-mean advantage: the score over the response's length
    write(
        tmp_path / "algos" / "my_algo.py",
        "def per_token(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True,\n"
        "              config=None, **kw):\n"
        "    assert norm_adv_by_std_in_grpo is False\n"
        "    adv = token_level_rewards.sum(-1, keepdim=True) / response_mask.sum(-1, keepdim=True) * response_mask\n"
        "    return adv, adv\n",
    )
    monkeypatch.chdir(tmp_path)
    scores = torch.tensor([1.0, 3.0, 6.0])
    adv = compute_advantages(
        "algos/my_algo.py:per_token",
        scores,
        torch.tensor([0, 0, 1]),
        norm_by_std=False,
        response_lengths=torch.tensor([2.0, 3.0, 4.0]),
    )
    close(adv, [0.5, 1.0, 1.5])  # 1/2, 3/3, 6/4
    assert adv.dtype == torch.float32


def test_user_estimator_bad_output_is_rejected(tmp_path: Path):
    f = write(
        tmp_path / "bad.py",
        "import torch\n"
        "def short(token_level_rewards, response_mask, **kw):\n    a = token_level_rewards[:1]\n    return a, a\n"
        "def nan(token_level_rewards, response_mask, **kw):\n    a = token_level_rewards * float('nan')\n"
        "    return a, a\n"
        "def one(token_level_rewards, response_mask, **kw):\n    return token_level_rewards\n",
    )
    scores, group = torch.tensor([1.0, 2.0]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match=r"advantages of shape \(1, 1\), expected \(2, 1\)"):
        compute_advantages(f"{f}:short", scores, group)
    with pytest.raises(FloatingPointError, match="NaN"):
        compute_advantages(f"{f}:nan", scores, group)
    with pytest.raises(ValueError, match=r"must return \(advantages, returns\)"):
        compute_advantages(f"{f}:one", scores, group)


def test_registered_estimator_by_name():
    try:

        @estimators.register_adv_est("test_double")
        def double(token_level_rewards, response_mask, **_):
            return 2 * token_level_rewards, 2 * token_level_rewards

        assert get_advantage_fn("test_double") is double
        close(compute_advantages("test_double", torch.tensor([1.0, -2.0]), torch.tensor([0, 0])), [2.0, -4.0])
    finally:
        estimators.ADV_ESTIMATORS.pop("test_double", None)
    assert "test_double" not in estimators.ADV_ESTIMATORS


def test_user_policy_loss_from_file(tmp_path: Path):
    # plain REINFORCE (-A * logp), written as for verl: its signature, config.global_batch_info into agg_loss
    f = write(
        tmp_path / "my_loss.py",
        "from vlmrl.algorithms.losses import agg_loss\n"
        "def reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode='token-mean', config=None,\n"
        "              rollout_is_weights=None):\n"
        "    loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode, **config.global_batch_info)\n"
        "    return loss, {'actor/my_metric': 1.0}\n",
    )
    fn = get_policy_loss(f"{f}:reinforce")
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -4.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    cfg = LossConfig(global_batch_info=dict(dp_size=1, batch_num_tokens=3.0, global_batch_size=2.0))
    loss, metrics = fn(logp.detach(), logp, T([1.0, 1.0], [-2.0, -2.0]), mask, "token-mean", cfg, None)
    close(loss, (1.0 + 2.0 - 1.0) / 3)  # -1*-1 + -1*-2 + 2*-0.5 (the padded -4 is masked)
    assert metrics == {"actor/my_metric": 1.0}


def test_builtin_policy_loss_by_name():
    assert get_policy_loss("ppo") is vanilla  # vlmrl's older name of verl's "vanilla"


def test_unknown_names_list_the_choices():
    choices = r"'dr_grpo', 'gae', 'gdpo', 'gpg', 'grpo'"
    with pytest.raises(ValueError, match=r"adv_estimator='gpro'.*" + choices):
        get_advantage_fn("gpro")
    with pytest.raises(ValueError, match=r"loss_mode='ppo2'.*'cispo'.*'vanilla'"):
        get_policy_loss("ppo2")


def test_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match="nope.py.*does not exist"):
        get_advantage_fn(f"{missing}:fn")
    with pytest.raises(FileNotFoundError, match="actor.policy_loss"):
        get_policy_loss(f"{missing}:fn")


def test_missing_function(tmp_path: Path):
    f = write(
        tmp_path / "algo_fns.py",
        "def present(token_level_rewards, response_mask, **kw):\n    return 0\n\nNOT_A_FN = 3\n",
    )
    with pytest.raises(AttributeError, match=r"no function 'absent' \(it has: present\)"):
        get_advantage_fn(f"{f}:absent")
    with pytest.raises(AttributeError, match="no function 'NOT_A_FN'"):
        get_policy_loss(f"{f}:NOT_A_FN")
