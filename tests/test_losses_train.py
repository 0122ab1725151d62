"""Each policy loss trains: the tiny model in one in-process hybrid worker (HF rollout), two steps of generate +
update per loss mode, with per-sample advantages of both signs and two mini-batches per step (so the second
mini-batch's ratio is off 1 and the clipped branches are live). And verl's keys of a loss reach it through the real
launch command (``policy_loss.loss_mode`` naming a user's loss, with every setting a loss reads)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runs import base_args, make_colour_data, metrics, train_here_to_end
from vlmrl.algorithms.losses import POLICY_LOSSES, LossConfig, PolicyLossSettings


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


@pytest.fixture(scope="module")
def worker(tiny_model_dir, colour_data, tmp_path_factory):
    from vlmrl.config import load
    from vlmrl.config.plan import worker_plan
    from vlmrl.data import RLDataset
    from vlmrl.workers.hybrid import HybridWorker

    cfg = load(
        [
            f"data.train_files={colour_data / 'train.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.device=cpu",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=4",
            "data.max_response_length=6",
            "actor_rollout_ref.actor.optim.lr=5e-3",
        ],
        config_name="tiny_cpu",
    )
    w = HybridWorker(
        worker_plan(cfg, 4, 1, 0, cuda_available=False), 0, f"file://{tmp_path_factory.mktemp('rdv') / 'rendezvous'}"
    )
    ds = RLDataset(str(colour_data / "train.parquet"), w.processor, cfg.data, split="train")
    yield w, ds
    w.shutdown()


@pytest.mark.parametrize("mode", sorted(set(POLICY_LOSSES) - {"bypass_mode"}))  # bypass: its own test below
def test_each_loss_trains_two_steps(worker, mode: str) -> None:
    from vlmrl.batch import TrainShard

    w, ds = worker
    pol = w.policy
    pol.loss_config = LossConfig(
        clip_ratio=0.2,
        clip_ratio_high=0.28,
        policy_loss=PolicyLossSettings(
            loss_mode=mode, clip_cov_ratio=0.2, clip_cov_lb=-10.0, kl_cov_ratio=0.2, dro_beta=0.1
        ),
    )
    for step in range(2):
        before = {n: p.detach().clone() for n, p in pol.model.named_parameters() if p.requires_grad}
        rb = w.generate(ds.get_batch([2 * step, 2 * step + 1]))
        shard = TrainShard(
            stored=[(rid, g) for _, rid, g in rb.origins],
            sent=None,
            advantages=[1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.25, -0.25],
            mini_batch_samples=4,
        )
        m = w.update(shard)
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0, (mode, step, m)
        moved = sum(float((p.detach() - before[n]).abs().sum()) for n, p in pol.model.named_parameters() if n in before)
        assert moved > 0, (mode, step, "the weights did not change")
        if mode in ("vanilla", "gspo", "cispo", "dppo_tv", "dppo_kl", "geo_mean"):
            assert "actor/pg_clipfrac" in m and "actor/ppo_kl" in m, m


SPY = """
import json
from pathlib import Path

from vlmrl.algorithms.losses import get_policy_loss


def spy(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
        rollout_is_weights=None):
    pl = config.policy_loss
    seen = dict(loss_agg_mode=loss_agg_mode, clip=[config.clip_ratio_low, config.clip_ratio_high, config.clip_ratio_c],
                tau=[config.tau_pos, config.tau_neg], cov=[pl.clip_cov_ratio, pl.clip_cov_lb, pl.clip_cov_ub,
                pl.kl_cov_ratio, pl.ppo_kl_coef], dro_beta=pl.dro_beta, info=sorted(config.global_batch_info))
    Path(__file__).with_name("seen.json").write_text(json.dumps(seen))
    return get_policy_loss("gspo")(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                   rollout_is_weights)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["leaf", "detached"])
def test_a_loss_with_no_path_to_the_policy_stops_the_update(worker, kind: str) -> None:
    """Issue 44 item 5: a registered policy loss that returns a new leaf tensor (``requires_grad`` but no path to
    the parameters) or a detached value would train nothing but the entropy bonus at a gradient norm of 0; the first
    micro-batch's check stops the update naming the loss, before any weight changes."""
    import torch

    from vlmrl.algorithms.algorithm import AlgorithmError
    from vlmrl.algorithms.losses import POLICY_LOSSES, register_policy_loss
    from vlmrl.batch import TrainShard

    name = f"no_path_{kind}"

    @register_policy_loss(name)
    def no_path(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        if kind == "leaf":
            return torch.tensor(0.5, requires_grad=True), {}
        return (log_prob * advantages).mean().detach(), {}

    w, ds = worker
    pol = w.policy
    settings = PolicyLossSettings(loss_mode=name)
    pol.loss_config = LossConfig(clip_ratio=0.2, entropy_coeff=0.01, policy_loss=settings)
    pol._gradient_path_checked = False

    def full(t):  # a parameter's whole value (FSDP shards it between a push and the next backward)
        t = t.detach()
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()

    rb = w.generate(ds.get_batch([0, 1]))
    before = {n: full(p) for n, p in pol.model.named_parameters() if p.requires_grad}
    try:
        adv = [1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.25, -0.25]
        shard = TrainShard(
            stored=[(rid, g) for _, rid, g in rb.origins], sent=None, advantages=adv, mini_batch_samples=8
        )
        with pytest.raises(AlgorithmError, match=f"the policy loss '{name}' at step .* does not depend on the policy"):
            w.update(shard)
    finally:
        POLICY_LOSSES.pop(name)
        pol._gradient_path_checked = False
    assert all(torch.equal(full(p), before[n]) for n, p in pol.model.named_parameters() if n in before)


def test_verls_loss_keys_reach_a_users_loss_through_the_launch_command(tiny_model_dir, colour_data, tmp_path) -> None:
    """Every ``actor.policy_loss.*`` key and the actor keys the losses read, set on the command line as in a verl
    script, arrive in the loss's ``config`` (a user's loss from a file, verl's signature); it trains 2 steps."""
    spy = tmp_path / "spy.py"
    spy.write_text(SPY)
    a = "actor_rollout_ref.actor"
    out = tmp_path / "run"
    train_here_to_end(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            "trainer.total_training_steps=2",
            "data.val_files=null",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            f"{a}.policy_loss.loss_mode={spy}:spy",
            f"{a}.loss_agg_mode=seq-mean-token-mean",
            f"{a}.clip_ratio_low=0.0003",
            f"{a}.clip_ratio_high=0.0004",
            f"{a}.clip_ratio_c=10.0",
            f"{a}.tau_pos=1.5",
            f"{a}.tau_neg=2.5",
            f"{a}.policy_loss.clip_cov_ratio=0.001",
            f"{a}.policy_loss.clip_cov_lb=2.0",
            f"{a}.policy_loss.clip_cov_ub=6.0",
            f"{a}.policy_loss.kl_cov_ratio=0.003",
            f"{a}.policy_loss.ppo_kl_coef=0.7",
            f"{a}.policy_loss.dro_beta=0.05",
        )
    )
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == dict(
        loss_agg_mode="seq-mean-token-mean",
        clip=[0.0003, 0.0004, 10.0],
        tau=[1.5, 2.5],
        cov=[0.001, 2.0, 6.0, 0.003, 0.7],
        dro_beta=0.05,
        info=["batch_num_tokens", "dp_size", "global_batch_size", "loss_scale_factor"],
    )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/pg_loss"]) and r["actor/grad_norm"] > 0 for r in rows), rows


def test_rollout_correction_in_the_update(worker) -> None:
    """The workers' update corrects against the engine's log-probs: bounds that keep everything change nothing in
    what trains (the metrics say so; the weights near 1), bounds no sample meets take every token out of the loss
    (the mini-batch is skipped: no optimizer step, the weights unchanged)."""
    from types import SimpleNamespace

    from vlmrl.batch import TrainShard

    w, ds = worker
    pol = w.policy
    pol.loss_config = LossConfig(clip_ratio=0.2)

    def step(correction, rows):
        pol.correction = correction
        rb = w.generate(ds.get_batch(rows))
        shard = TrainShard(
            stored=[(rid, g) for _, rid, g in rb.origins],
            sent=None,
            advantages=[1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.25, -0.25],
            mini_batch_samples=8,
        )
        before = {n: _full(p) for n, p in pol.model.named_parameters() if p.requires_grad}
        m = w.update(shard)
        moved = sum(float((_full(p) - before[n]).abs().sum()) for n, p in pol.model.named_parameters() if n in before)
        return m, moved

    base = dict(
        rollout_is=None,
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=False,
        rollout_rs=None,
        rollout_rs_threshold=None,
        bypass_mode=False,
    )
    try:
        keep = SimpleNamespace(
            **{
                **base,
                "rollout_is": "token",
                "rollout_is_threshold": 100.0,
                "rollout_rs": "token_k1",
                "rollout_rs_threshold": "0.001_1000",
            }
        )
        m, moved = step(keep, [8, 9])
        assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0 and moved > 0, m
        assert abs(m["rollout_corr/rollout_is_mean"] - 1.0) < 0.05 and abs(m["rollout_corr/kl"]) < 0.05, m
        none = SimpleNamespace(**{**base, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "1000_2000"})
        m, moved = step(none, [10, 11])
        assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0, m
        assert m["actor/empty_mini_batches"] == 1.0 and "actor/pg_loss" not in m and moved == 0.0, m
    finally:
        pol.correction = None


def _full(p):
    """A parameter's full value, whether FSDP holds it sharded (a DTensor) or gathered."""
    t = p.detach()
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()


def test_bypass_mode_in_the_update(worker) -> None:
    """Rollout correction's bypass mode in the workers' update: the engine's log-probs are the old ones (no
    recomputation), the loss computes weights and rejection against the current policy and logs them."""
    from types import SimpleNamespace

    from vlmrl.batch import TrainShard

    w, ds = worker
    pol = w.policy
    rc = SimpleNamespace(
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_is_batch_normalize=False,
        rollout_rs="token_k1",
        rollout_rs_threshold="0.5_2.0",
        bypass_mode=True,
        loss_type="reinforce",
    )
    try:
        pol.correction = rc
        pol.loss_config = LossConfig(clip_ratio=0.2, policy_loss=PolicyLossSettings(loss_mode="bypass_mode"))
        pol.loss_config.policy_loss.rollout_correction = rc
        rb = w.generate(ds.get_batch([12, 13]))
        shard = TrainShard(
            stored=[(rid, g) for _, rid, g in rb.origins],
            sent=None,
            advantages=[1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.25, -0.25],
            mini_batch_samples=4,
        )
        m = w.update(shard)
        assert m["actor/grad_norm"] > 0 and "rollout_corr/rollout_is_mean" in m and "rollout_corr/kl" in m, m
        assert abs(m["rollout_corr/rollout_is_mean"] - 1.0) < 0.1, m
    finally:
        pol.correction = None
