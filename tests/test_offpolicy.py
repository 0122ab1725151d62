"""The one-step off-policy trainer (``actor_rollout_ref.hybrid_engine=False``): a rollout pool beside the training
pool, the batch of step t+1 generated while step t trains, weights synced through a process group spanning both.

Fast: the config (verl's keys, the checks, the default correction), the sync's buckets and its broadcast between
processes, the prompt split. Runs (a training subprocess each, 1 training + 1 rollout worker): staleness 0 then 1,
the overlap's timings, exact resume (the in-flight batch drawn again), the sync's equality (a resumed run's engine,
started from the base model, holds the checkpoint's weights after the sync: its log-probs equal the trainer's), the
KL fallback, the HF rollout in a pool of its own, and a 2-node Ray cluster with one pool on each node.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import tempfile
from pathlib import Path

import pytest
import torch

from runs import base_args, make_colour_data, metrics, processes, run_here
from vlmrl.config.checks import batch_problems
from vlmrl.config.command import load
from vlmrl.config.plan import rollout_correction, rollout_plan, rollout_world, worker_plan
from vlmrl.trainer.offpolicy import batch_seed
from vlmrl.trainer.rollouts import chunk_prompts
from vlmrl.workers.sync import WeightMeta, WeightSync, buckets, meta_of

POOLS = ("actor_rollout_ref.hybrid_engine=False", "trainer.cpu_workers=1", "rollout.cpu_workers=1")
"""Two pools of one CPU worker each."""
REQUIRED = ("data.train_files=x", "actor_rollout_ref.model.path=m")
"""The required settings (a config check reads no files)."""
ASYNC = (*POOLS, *REQUIRED)

# ------------------------------------------------------------------------------------------------------ config


def test_verl_keys_of_the_one_step_trainer_are_accepted() -> None:
    cfg = load([*ASYNC, "rollout.nnodes=1", "rollout.n_gpus_per_node=2", "async.fallback_kl=0.5", "trainer.device=cpu"])
    assert cfg.actor_rollout_ref.hybrid_engine is False and cfg.async_training.fallback_kl == 0.5
    assert cfg.rollout.n_gpus_per_node == 2 and rollout_world(cfg) == 1  # CPU: rollout.cpu_workers
    plan = worker_plan(cfg, 10, 1, 0, cuda_available=False)
    assert plan.role == "actor" and plan.tp == 1 and plan.world == 1
    pool = rollout_plan(cfg, plan, cuda_available=False)
    assert pool.role == "rollout" and pool.world == 1 and pool.critic is None and pool.rollout_correction is None
    # the hybrid engine is unchanged
    hybrid = worker_plan(load([*REQUIRED, "trainer.device=cpu"]), 10, 1, 0, cuda_available=False)
    assert hybrid.role == "hybrid" and rollout_world(load(list(REQUIRED))) == 0


def test_the_stale_step_is_corrected_by_token_tis_unless_the_user_says_otherwise() -> None:
    rc = rollout_correction(load(list(ASYNC)))
    assert rc is not None and rc.rollout_is == "token" and rc.rollout_is_threshold == 2.0 and not rc.bypass_mode
    assert rollout_correction(load([*ASYNC, "async.tis_by_default=False"])) is None
    assert rollout_correction(load(list(REQUIRED))) is None  # the hybrid engine: on-policy, nothing to correct
    own = rollout_correction(
        load(
            [
                *ASYNC,
                "algorithm.rollout_correction.rollout_rs=token_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
            ]
        )
    )
    assert own is not None and own.rollout_is is None and own.rollout_rs == "token_k1"
    # verl's own config for this trainer: bypass mode (the engine's log-probs are the old ones)
    verl = load(list(ASYNC), config_name="one_step_off_ppo_trainer")
    assert verl.algorithm.rollout_correction.bypass_mode and verl.rollout.n_gpus_per_node == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.launcher=inline"], "trainer.launcher=inline: the one-step off-policy trainer runs a training pool"),
        (["rollout.cpu_workers=0"], "rollout.cpu_workers=0: the rollout pool"),
        (["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "must divide rollout.cpu_workers=1"),
        (["async.fallback_kl=-1"], "async_training.fallback_kl=-1"),
        (["async.fallback_kl=0.1", "async.tis_by_default=False"], "the KL is measured by the rollout correction"),
        (["rollout.nnodes=2", "trainer.launcher=local"], "rollout.nnodes=2 with trainer.launcher=local"),
        (["actor_rollout_ref.rollout.temperature=0.7"], "token-level TIS (async_training.tis_by_default), which needs"),
    ],
)
def test_pool_settings_that_cannot_run_are_refused(overrides: list[str], message: str) -> None:
    problems = batch_problems(load([*ASYNC, "trainer.device=cpu", *overrides]))  # what the config gate reports
    assert any(message in p for p in problems), problems
    assert not batch_problems(load([*ASYNC, "trainer.device=cpu"]))


# ------------------------------------------------------------------------------------------------- the sync


def test_buckets_keep_one_dtype_and_the_size_limit() -> None:
    meta = [
        WeightMeta("a", (4,), "float32"),
        WeightMeta("b", (8,), "float32"),
        WeightMeta("c", (2,), "bfloat16"),
        WeightMeta("d", (100,), "float32"),
        WeightMeta("e", (1,), "float32"),
    ]
    # 16 + 32 bytes fit 64; c changes dtype; d (400 bytes) is over the limit alone; e follows d's full bucket
    assert buckets(meta, limit=64) == [[0, 1], [2], [3], [4]]
    assert buckets(meta, limit=10_000) == [[0, 1], [2], [3, 4]]
    assert sum(m.nbytes for m in meta) == 16 + 32 + 4 + 400 + 4


def _sync_member(rank: int, init: str, meta: list[WeightMeta], out: dict) -> None:
    torch.manual_seed(0)
    named = [(m.name, torch.randn(m.shape).to(getattr(torch, m.dtype))) for m in meta]
    sync = WeightSync(init, rank, 3, "cpu", meta, timeout_s=60)
    if rank == 0:
        out[0] = sync.send(iter(named))
    else:  # each received tensor equals the sender's, under its name, in order
        got = [(n, t.clone()) for n, t in sync.receive()]
        out[rank] = all(n == m and torch.equal(t, s) for (n, t), (m, s) in zip(got, named)) and len(got) == len(named)
    sync.close()


def test_the_sync_broadcasts_every_tensor_bit_for_bit_to_every_rollout_worker() -> None:
    torch.manual_seed(0)
    weights = [
        ("model.embed", torch.randn(32, 8)),
        ("model.norm", torch.randn(8).bfloat16()),
        ("lm_head", torch.randn(32, 8)),
        ("visual.patch", torch.randn(3, 3, 2)),
    ]
    meta = meta_of(weights)
    with tempfile.TemporaryDirectory() as d, mp.Manager() as manager:
        out = manager.dict()
        ctx = processes()
        procs = [ctx.Process(target=_sync_member, args=(r, f"file://{d}/store", meta, out)) for r in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert dict(out) == {0: sum(m.nbytes for m in meta), 1: True, 2: True}


def test_a_sender_that_yields_other_tensors_than_announced_fails_naming_them() -> None:
    sync = WeightSync.__new__(WeightSync)
    sync.meta, sync._buckets, sync.device = [WeightMeta("a", (2,), "float32")], [[0]], "cpu"
    with pytest.raises(RuntimeError, match=r"tensor 0 is b \(2,\) torch.float32, the rollout workers expect a"):
        sync.send(iter([("b", torch.zeros(2))]))


def test_a_sync_blocked_by_a_dead_rollout_worker_is_reported_at_once() -> None:
    """Issue 44 item 12: the training pool's send blocks in the broadcast when a rollout worker dies (until the
    collective's timeout); the driver watches the other pool while it waits and names the dead worker at once."""
    import time

    from vlmrl.trainer.offpolicy import wait_watching
    from vlmrl.workers.group import Pending, WorkerError

    class Pool:
        def __init__(self, dies_after: float) -> None:
            self.t0, self.dies_after = time.monotonic(), dies_after

        def dead_worker_error(self, stage: str, grace_s: float = 2.0) -> WorkerError | None:
            gone = time.monotonic() - self.t0 > self.dies_after
            return WorkerError(f"rollout worker 1 died during the {stage}") if gone else None

    blocked = Pending(lambda: time.sleep(30) or [])
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="rollout worker 1 died during the weight sync"):
        wait_watching(blocked, Pool(dies_after=0.3), "weight sync", poll_s=0.1)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5
    assert wait_watching(Pending(lambda: [1, 2]), Pool(dies_after=60), "weight sync") == [1, 2]
    failing = Pending(lambda: (_ for _ in ()).throw(WorkerError("worker 0 failed")))
    with pytest.raises(WorkerError, match="worker 0 failed"):
        wait_watching(failing, Pool(dies_after=60), "weight sync")


def test_a_broken_broadcast_waits_briefly_for_the_peer_whose_kill_broke_it() -> None:
    """A rollout worker killed by a signal resets its sockets before its exit can be collected, so the trainer's
    broken broadcast arrives first (a CI run named the training worker's 'Connection reset by peer'); asked after
    the break, the pool waits up to ``grace_s`` for a worker to end and names it. While polling (grace 0) an alive
    pool answers at once."""
    import time

    from vlmrl.workers.launch_local import ProcessWorkerGroup

    group = ProcessWorkerGroup.__new__(ProcessWorkerGroup)
    group.role = "rollout"
    group.procs = [mp.get_context("spawn").Process(target=time.sleep, args=(1.0 + i,)) for i in range(2)]
    for p in group.procs:
        p.start()
    try:
        t0 = time.monotonic()
        assert group.dead_worker_error("weight sync", grace_s=0.0) is None
        assert time.monotonic() - t0 < 0.2
        assert group.dead_worker_error("weight sync", grace_s=0.05) is None
        error = group.dead_worker_error("weight sync", grace_s=30.0)
        assert error is not None and time.monotonic() - t0 < 10
        assert str(error) == "rollout worker 0 died during weight sync (exit code 0)", str(error)
    finally:
        for p in group.procs:
            p.kill()
            p.join()


def test_prompts_split_over_engine_groups_and_seeds_depend_on_the_step_only() -> None:
    assert chunk_prompts(list(range(8)), 4, 2) == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]
    assert chunk_prompts(list(range(3)), 2, 1) == [[0, 1], [2]]
    assert (
        batch_seed(1, 5) == batch_seed(1, 5) and len({batch_seed(1, s, k) for s in range(50) for k in range(3)}) == 150
    )


# ------------------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


def _prompts(folder: Path, step: int) -> list[str]:
    return [json.loads(x)["prompt"] for x in (folder / f"step_{step:06d}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_one_step_off_policy_overlaps_resumes_exactly_and_falls_back(tiny_model_dir, colour_data, tmp_path) -> None:
    """3 steps on 1 training + 1 rollout worker: the first batch comes from the initial weights (staleness 0, the
    engine's log-probs equal the trainer's), the next from the weights one update back (staleness 1), corrected by token
    TIS; each batch after the first was generated on the rollout pool while the training pool ran the previous update
    (their wall-clock spans, ``timeline/*``, intersect); checkpoints record the sampler before the batch in flight.
    Resumed from step 2 with ``async.fallback_kl`` tiny: step 3 is generated again from the checkpoint's weights (same
    prompts; the engine, started from the base model, got them only through the sync: log-probs equal ≤ 1e-5), step 4
    trains the stale batch (its KL trips the fallback) and step 5 waits for a fresh generation."""
    first, dumps = tmp_path / "first", tmp_path / "dumps_first"
    common = (*POOLS, "trainer.val_before_train=false", "trainer.save_freq=2", "trainer.test_freq=-1")
    run = run_here(
        base_args(
            tiny_model_dir,
            colour_data,
            first,
            *common,
            "trainer.total_training_steps=3",
            f"trainer.rollout_data_dir={dumps}",
        )
    )
    out = run.output()
    assert "1 training worker(s)" in out and "1 rollout worker(s)" in out, out[-3000:]
    rows = metrics(first)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["rollout/logprob_diff"] <= 1e-5 < rows[1]["rollout/logprob_diff"]
    for r in rows:
        assert r["timing/param_sync_s"] > 0 and r["async/param_sync_mb"] > 0.5 and r["timing/gen_s"] > 0
        assert "timing/wait_prev_gen_s" in r and "timing/push_s" not in r and "timing/sleep_s" not in r
        assert r["rollout_corr/rollout_is_max"] <= 2.0 + 1e-6  # token TIS at 2.0 by default
    assert rows[1]["rollout_corr/k3_kl"] > 0
    for prev, row in zip(rows, rows[1:]):  # the overlap itself: batch t+1 generated while update t ran
        assert row["timeline/gen_start"] < prev["timeline/update_end"], (prev, row)
        assert row["timeline/gen_end"] > prev["timeline/update_start"], (prev, row)
    state = json.loads((first / "global_step_2" / "trainer_state.json").read_text())
    assert state["sampler"]["offset"] == 2  # batch 3 was in flight: drawn again on resume
    assert "log-prob drift" not in out  # the stale steps' drift is expected, not a finding
    from vlmrl.report.__main__ import main as report

    assert report([str(first), "--output", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<section class='panel' id='panel-overlap'>" in page  # drawn (an empty panel is 'panel empty')

    # resume from step 2 (the step-3 checkpoint removed), with a fallback threshold every stale step exceeds
    resumed, dumps2 = tmp_path / "resumed", tmp_path / "dumps_resumed"
    import shutil

    shutil.copytree(first / "global_step_2", resumed / "global_step_2")
    (resumed / "latest_checkpointed_iteration.txt").write_text("2")
    run = run_here(
        base_args(
            tiny_model_dir,
            colour_data,
            resumed,
            *common,
            "trainer.total_training_steps=5",
            f"trainer.rollout_data_dir={dumps2}",
            "async.fallback_kl=1e-9",
        )
    )
    rows = metrics(resumed)
    assert [r["step"] for r in rows] == [3, 4, 5], rows
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["async/fallback"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[0]["rollout/logprob_diff"] <= 1e-5 and rows[2]["rollout/logprob_diff"] <= 1e-5
    assert _prompts(dumps2, 3) == _prompts(dumps, 3)  # the batch that was in flight, drawn again


# -------------------------------------------------------------------- the correction without a separate forward


def test_token_tis_from_the_updates_own_forward_equals_a_separate_old_log_prob_pass(tiny_model_dir, tmp_path) -> None:
    """One pass of one mini-batch with token-level TIS (the off-policy trainer's default): the weights come from each
    micro-batch's own forward (detached), not from a separate forward for the old log-probs. Same update (weights
    after the step ≤ 1e-6) and the same ``rollout_corr/*`` metrics as the separate pass, on engine log-probs made
    stale on purpose (so weights are truncated at 2)."""
    import copy
    from dataclasses import replace

    from vlmrl.batch import TrainShard
    from vlmrl.config.plan import worker_plan
    from vlmrl.data import RLDataset
    from vlmrl.workers.hybrid import HybridWorker

    data = make_colour_data(tmp_path / "colour")
    cfg = load(
        [
            f"data.train_files={data / 'train.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.device=cpu",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.rollout.n=4",
            "data.max_response_length=6",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
            "algorithm.rollout_correction.rollout_is=token",
        ],
        config_name="tiny_cpu",
    )
    w = HybridWorker(worker_plan(cfg, 4, 1, 0, cuda_available=False), 0, f"file://{tmp_path / 'rendezvous'}")
    try:
        pol = w.policy
        ds = RLDataset(str(data / "train.parquet"), w.processor, cfg.data, split="train")
        rb = w.generate(ds.get_batch([0, 1]))
        stored = [(rid, g) for _, rid, g in rb.origins]
        shard = TrainShard(stored=stored, sent=None, advantages=[], mini_batch_samples=8)
        x, _ = w._shard_inputs(shard)
        g = torch.Generator().manual_seed(0)
        stale = x.rollout_logprobs + 0.7 * torch.randn(x.rollout_logprobs.shape, generator=g)
        x = replace(x, rollout_logprobs=stale)
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0, 0.25, -0.25])
        saved = (
            copy.deepcopy(pol.model.state_dict()),
            copy.deepcopy(pol.optimizer.state_dict()),
            copy.deepcopy(pol.scheduler.state_dict()),
        )
        lazy = pol.update(x, adv, 8)
        after_lazy = {n: p.detach().full_tensor().clone() for n, p in pol.model.named_parameters()}
        pol.model.load_state_dict(saved[0])
        pol.optimizer.load_state_dict(saved[1])
        pol.scheduler.load_state_dict(saved[2])
        old = pol.logprobs(x, "actor")  # the separate forward
        eager = pol.update(x, adv, 8, given=(old, None))
        assert lazy["rollout_corr/rollout_is_max"] == 2.0  # some weights truncated
        corr = sorted(k for k in eager if k.startswith("rollout_corr/"))
        assert corr == sorted(k for k in lazy if k.startswith("rollout_corr/")) and len(corr) >= 6, corr
        for k in [*corr, "actor/pg_loss", "actor/grad_norm"]:
            assert abs(lazy[k] - eager[k]) <= 1e-6 * max(1.0, abs(eager[k])), (k, lazy[k], eager[k])
        for n, p in pol.model.named_parameters():
            assert torch.allclose(p.detach().full_tensor(), after_lazy[n], atol=1e-6), n
    finally:
        w.shutdown()


# --------------------------------------------------------------------------------- with the rest of the trainer


FULLY_ASYNC = (
    "async_training.mode=fully_async",
    "async_training.staleness_threshold=1",
    "async_training.trigger_parameter_sync_step=1",
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_step_off_policy", "fully_async"])
def test_multi_turn_tools_run_in_the_rollout_pool(tmp_path, mode) -> None:
    """The zoom demo's config (``tool_zoom_cpu``) off-policy: the rollout worker runs the agent loop and the tool
    (a policy warm-started to always zoom), the trajectories (tool turns masked, the tool's images) travel to the
    training worker; one-step: the second step's batch generated while the first trained; fully async: the groups
    streamed, each trajectory's turns on its own schedule, partial rollouts across the syncs after every step."""
    from test_multi_turn import always_zoom_policy

    data, warm = always_zoom_policy()
    out = tmp_path / "run"
    steps = 2 if mode == "one_step_off_policy" else 3
    run_here(
        [
            "--config-name",
            "tool_zoom_cpu",
            f"data.train_files={data / 'train.parquet'}",
            "data.val_files=null",
            f"actor_rollout_ref.model.path={warm}",
            f"trainer.default_local_dir={out}",
            "trainer.logger=[jsonl]",
            f"trainer.total_training_steps={steps}",
            "data.train_batch_size=8",
            *POOLS,
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            *(FULLY_ASYNC if mode == "fully_async" else ()),
        ]
    )
    rows = metrics(out)
    assert len(rows) == steps
    if mode == "one_step_off_policy":
        assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
    else:
        assert rows[0]["async/staleness_max"] == 0.0 and all(r["async/staleness_max"] <= 2 for r in rows)
        assert all(r["async/syncs"] >= 1 for r in rows[1:])
    for r in rows:
        assert r["multi_turn/called_share"] > 0.5 and r["multi_turn/calls/image_zoom"] >= 16 and r["timing/tool_s"] > 0
        assert r["actor/grad_norm"] > 0


@pytest.mark.slow
def test_video_with_dynamic_sampling_off_policy(tiny_model_dir, tmp_path) -> None:
    """Video prompts and DAPO's dynamic sampling (2 samples a prompt: many groups do not vary): more batches are
    generated on the rollout pool (from the current weights) until the step is full or 3 were tried, then the next
    step's batch is launched; every step trains."""
    import subprocess
    import sys

    data = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            "preprocess/synthetic.py",
            "--output-dir",
            str(data),
            "--families",
            "video_colour",
            "--image-size",
            "112",
            "--train-size",
            "256",
            "--test-size",
            "8",
            "--seed",
            "0",
            "--no-progress",
        ],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[1],
    )
    out = tmp_path / "run"
    run = run_here(
        base_args(
            tiny_model_dir,
            data,
            out,
            *POOLS,
            "trainer.total_training_steps=3",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.max_num_gen_batches=3",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.n=2",
        )
    )
    assert "videos/prompt 1" in run.output()
    rows = [r for r in metrics(out) if r.get("step", 0) > 0 and "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["filter_groups/gen_batches"] >= 1 and r["actor/grad_norm"] >= 0 for r in rows)
    assert rows[0]["async/staleness"] == 0.0 and rows[-1]["async/staleness"] == 1.0
    # two samples a prompt at chance: most groups do not vary, so the pool generates more batches within steps
    assert any(r["filter_groups/gen_batches"] > 1 for r in rows), rows


@pytest.mark.slow
def test_a_dead_rollout_worker_stops_the_run_naming_it(tiny_model_dir, colour_data, tmp_path) -> None:
    """The rollout pool's worker killed mid-run: the driver stops (no hang) naming the rollout worker and the stage,
    with the checkpoint to resume from, as for a training worker."""
    import time

    import psutil

    from runs import ENV, Run, wait_for_step

    out = tmp_path / "run"
    run = Run(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            *POOLS,
            "trainer.total_training_steps=500",
            "trainer.save_freq=1",
            "data.val_files=null",
        ),
        ENV,
    )
    try:
        wait_for_step(run, out, 2, timeout=300)
        victims = []
        for p in run.descendants():
            try:
                if "vlmrl-rollout-0" in " ".join(p.cmdline()):
                    victims.append(p)
            except psutil.Error:
                pass
        assert len(victims) == 1, [p.cmdline() for p in run.descendants()]
        victims[0].kill()
        t0 = time.monotonic()
        rc = run.wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        run.cleanup()
    text = run.output()
    assert rc == 1 and took < 90, (rc, took, text[-3000:])
    # (killed while generating, or while the weights were broadcast to it: the trainer's broken broadcast is then
    # reported as the rollout worker's death, not as the trainer's failure)
    died = re.search(r"rollout worker 0 died during (rollout|weight sync) \(killed by SIGKILL\)", text)
    assert "vlmrl: run stopped at step" in text and died, text[-3000:]
    assert "last complete checkpoint:" in text and "Traceback" not in text, text[-3000:]


REMAX_LORA_HF = (
    "algorithm.adv_estimator=remax",
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.rollout.name=hf",
    "trainer.cpu_workers=2",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.total_training_steps=3",
    "async.fallback_kl=1e-9",
)


@pytest.mark.slow
def test_remax_with_lora_on_the_hf_rollout_and_two_trainers_runs_off_policy(
    tiny_model_dir, colour_data, tmp_path
) -> None:
    """ReMax (its greedy baseline rolled out on the pool before the next batch is launched) with LoRA and a fallback
    threshold every stale step exceeds, on the HF rollout (the GPU machines' rollout, where vLLM cannot be
    installed: the rollout worker holds a plain copy of the model the sync writes into) and 2 training workers
    (the FSDP2 shards gathered, the LoRA weights merged, for the sync). The second step trains on the batch generated
    meanwhile. (PPO with a critic and the in-reward KL off policy: tests/test_reward_model.py's
    test_the_models_score_alone_on_the_one_step_off_policy_trainer_with_a_critic, whose run holds a reward model.)"""
    out = tmp_path / "run"
    run = run_here(
        base_args(
            tiny_model_dir,
            colour_data,
            out,
            *POOLS,
            *REMAX_LORA_HF,
            "trainer.val_before_train=false",
            "data.val_files=null",
        )
    )
    rows = metrics(out)
    assert [r["async/staleness"] for r in rows][:2] == [0.0, 1.0]
    assert all(r["actor/grad_norm"] > 0 for r in rows), rows
    assert all(r["timing/baseline_s"] > 0 for r in rows)
    assert "2 training worker(s)" in run.output() and "1 HF rollout model(s)" in run.output()
    # step 2's drift trips the fallback: step 3 is generated from the weights after 2 updates (LoRA B no longer
    # 0), merged and synced into the HF rollout's model: its log-probs equal the trainer's
    keys = ("step", "async/staleness", "async/fallback", "rollout_corr/k3_kl", "rollout/logprob_diff")
    assert rows[2]["async/fallback"] == 1.0 and rows[2]["async/staleness"] == 0.0, [
        {k: r.get(k) for k in keys} for r in rows
    ]
    assert rows[1]["rollout/logprob_diff"] > 1e-4 >= rows[2]["rollout/logprob_diff"]
