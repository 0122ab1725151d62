"""Rollout correction equals verl 0.9.1's ``rollout_corr_helper`` (run here on the same tensors): the importance
weights (token / sequence level, TIS and IcePop bounds, batch normalisation), the rejection mask of every option
(alone and combined, shared and per-option thresholds) and the metrics vlmrl reports, under the same names; the
settings' errors name the key; and the worker's update uses the weights and the mask."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from vlmrl.algorithms import rollout_correction as rc

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.ppo import rollout_corr_helper as verl_rc

ATOL = 1e-6


def batch(seed: int, B: int = 8, R: int = 10) -> dict[str, torch.Tensor]:
    """Trainer and engine log-probs of the same tokens, mostly close (bf16-like noise) with a few far apart (a
    stale or broken sample), right-padded responses of different lengths, one with a masked tool span."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, R + 1, (B,), generator=g)
    lengths[0] = R
    mask = (torch.arange(R)[None, :] < lengths[:, None]).float()
    mask[0, 3:5] = 0.0
    engine = -torch.rand(B, R, generator=g) * 4.0 - 0.01
    old = engine + torch.randn(B, R, generator=g) * 0.05
    old[1] += 0.8  # a sample the trainer now finds much likelier
    old[2, :3] -= 1.5  # and tokens it finds much less likely
    return {"old": old, "engine": engine, "mask": mask}


def settings(**kw) -> SimpleNamespace:
    base = dict(
        rollout_is=None,
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=False,
        rollout_rs=None,
        rollout_rs_threshold=None,
    )
    return SimpleNamespace(**{**base, **kw})


def compare(ours: tuple, b: dict, **kw) -> None:
    w_theirs, mask_theirs, m_theirs = verl_rc.compute_rollout_correction_and_rejection_mask(
        old_log_prob=b["old"], rollout_log_prob=b["engine"], response_mask=b["mask"], **kw
    )
    w, mask, metrics = ours
    if w_theirs is None:
        assert w is None
    else:
        torch.testing.assert_close(w, w_theirs.batch["rollout_is_weights"], atol=ATOL, rtol=0)
    torch.testing.assert_close(mask, mask_theirs, atol=0, rtol=0)
    for k, v in metrics.items():
        assert k in m_theirs, f"{k}: verl has no metric of that name"
        assert v == pytest.approx(float(m_theirs[k]), abs=1e-5), (k, v, m_theirs[k])


IS_CASES = [("token", 2.0), ("token", "0.5_1.5"), ("sequence", 2.0), ("sequence", "0.2_5.0"), ("token", 1.02)]
RS_CASES = [
    ("token_k1", "0.8_1.25"),
    ("token_k1", 1.5),
    ("token_k2", 0.05),
    ("token_k3", 0.02),
    ("seq_sum_k1", "0.5_2.0"),
    ("seq_sum_k2", 0.1),
    ("seq_sum_k3", 0.1),
    ("seq_mean_k1", "0.9_1.1"),
    ("seq_mean_k2", 0.01),
    ("seq_mean_k3", 0.01),
    ("seq_max_k2", 0.2),
    ("seq_max_k3", 0.2),
    ("token_k1,seq_max_k2", "0.7_1.4,0.3"),
    ("token_k2,seq_mean_k3,token_k2", 0.05),
]


@pytest.mark.parametrize("level,threshold", IS_CASES)
@pytest.mark.parametrize("normalize", [False, True])
def test_importance_weights_equal_verls(level: str, threshold, normalize: bool) -> None:
    for seed in (0, 1):
        b = batch(seed)
        s = settings(rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=normalize)
        ours = rc.correct(b["old"], b["engine"], b["mask"], s)
        compare(ours, b, rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=normalize)
        assert ours[0] is not None and not torch.equal(ours[0], b["mask"])  # the weights do something


@pytest.mark.parametrize("options,threshold", RS_CASES)
def test_rejection_masks_equal_verls(options: str, threshold) -> None:
    rejected = 0.0
    for seed in (0, 1, 2):
        b = batch(seed)
        ours = rc.correct(
            b["old"], b["engine"], b["mask"], settings(rollout_rs=options, rollout_rs_threshold=threshold)
        )
        compare(ours, b, rollout_rs=options, rollout_rs_threshold=threshold)
        rejected += float((b["mask"] - ours[1]).sum())
    assert rejected > 0, "these bounds reject nothing: the case tests nothing"


def test_weights_and_rejection_together() -> None:
    b = batch(3)
    s = settings(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
    compare(
        rc.correct(b["old"], b["engine"], b["mask"], s),
        b,
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_rs="seq_mean_k3",
        rollout_rs_threshold=0.01,
    )


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(rollout_is="tokens"), "rollout_is='tokens': use token | sequence"),
        (dict(rollout_is="token", rollout_is_threshold="2_1"), "a lower bound in (0, 1]"),
        (dict(rollout_is="token", rollout_is_threshold=1e-30), "finite and >= 1"),  # every weight ~0
        (dict(rollout_is="token", rollout_is_threshold=float("inf")), "finite and >= 1"),
        (dict(rollout_is="sequence", rollout_is_threshold="0.2_0.9"), "finite and >= 1"),
        (dict(rollout_is="token", rollout_is_threshold="x"), "not a number"),
        (dict(rollout_rs="token_k4", rollout_rs_threshold=1.0), "'token_k4' is not one of"),
        (dict(rollout_rs="token_k1"), "rollout_rs_threshold must be set"),
        (dict(rollout_rs="token_k2", rollout_rs_threshold="0.1_0.2"), "does not fit token_k2"),
        (dict(rollout_rs="token_k1,token_k2", rollout_rs_threshold="1,2,3"), "one threshold, or one per option"),
    ],
)
def test_bad_settings_name_the_key(kw: dict, message: str) -> None:
    b = batch(0)
    with pytest.raises((ValueError, TypeError), match="algorithm.rollout_correction") as e:
        rc.correct(b["old"], b["engine"], b["mask"], settings(**kw))
    assert message in str(e.value)


@pytest.mark.slow
def test_verls_rollout_correction_keys_train_through_the_launch_command(tiny_model_dir, tmp_path) -> None:
    """verl's decoupled-mode keys on the quick start's launch (2 CPU workers, vLLM's own log-probs): token-level
    truncated weights plus sequence rejection, 2 steps, the ratio metrics logged every step."""
    from runs import base_args, make_colour_data, metrics, run_here

    data = make_colour_data(tmp_path / "data")
    out = tmp_path / "run"
    k = "algorithm.rollout_correction"
    run_here(
        base_args(
            tiny_model_dir,
            data,
            out,
            "trainer.total_training_steps=2",
            "data.val_files=null",
            f"{k}.rollout_is=token",
            f"{k}.rollout_is_threshold=2.0",
            f"{k}.rollout_rs=seq_mean_k3",
            f"{k}.rollout_rs_threshold=0.01",
            f"{k}.rollout_is_batch_normalize=true",
        )
    )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0.5 < r["rollout_corr/rollout_is_mean"] < 1.5 and abs(r["rollout_corr/kl"]) < 0.05, r
        assert r["rollout_corr/rollout_is_batch_norm_factor"] > 0 and r["actor/grad_norm"] > 0, r
        assert 0.0 <= r["rollout_corr/rollout_rs_masked_fraction"] <= 1.0


def test_config_refusals(tmp_path) -> None:
    from runs import make_colour_data
    from vlmrl.config import ConfigError, load

    data = make_colour_data(tmp_path / "data")
    base = [f"data.train_files={data / 'train.parquet'}", f"actor_rollout_ref.model.path={tmp_path}"]
    k = "algorithm.rollout_correction"
    for extra, message in (
        ([f"{k}.bypass_mode=true", f"{k}.loss_type=clip"], "loss_type='clip': use ppo_clip | reinforce"),
        ([f"{k}.rollout_is=tokens"], "rollout_is='tokens': use token | sequence"),
        ([f"{k}.rollout_rs=token_k1"], "rollout_rs_threshold must be set"),
        ([f"{k}.rollout_is=token", "actor_rollout_ref.rollout.temperature=0.7"], "needs actor_rollout_ref.rollout"),
    ):
        with pytest.raises(ConfigError, match="algorithm.rollout_correction") as e:
            load([*base, *extra], config_name="tiny_cpu")
        assert message in str(e.value), str(e.value)


@pytest.mark.slow
def test_verls_bypass_mode_trains_through_the_launch_command(tiny_model_dir, tmp_path) -> None:
    """``bypass_mode=True`` with REINFORCE and truncated weights (one in-process worker, the HF rollout's log-probs as
    the old ones): 2 steps, the loss's ratio metrics logged."""
    from runs import base_args, make_colour_data, metrics, train_here_to_end

    data = make_colour_data(tmp_path / "data")
    out = tmp_path / "run"
    k = "algorithm.rollout_correction"
    train_here_to_end(
        base_args(
            tiny_model_dir,
            data,
            out,
            "trainer.total_training_steps=2",
            "data.val_files=null",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            f"{k}.bypass_mode=true",
            f"{k}.loss_type=reinforce",
            f"{k}.rollout_is=token",
            f"{k}.rollout_is_threshold=2.0",
        )
    )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.5 < r["rollout_corr/rollout_is_mean"] < 1.5 and r["actor/grad_norm"] > 0 for r in rows), rows
