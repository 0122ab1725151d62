"""Scale: tensor-parallel rollout engines shared by groups of workers (vLLM's CPU build runs them here), and the
guard that keeps an engine's workers sampling in step."""

from __future__ import annotations

import json
import multiprocessing as mp
import types
from pathlib import Path

import pytest
from runs import base_args, make_colour_data, metrics, run_to_end

# ----------------------------------------------------------------------------------- tensor-parallel engines


def _guard_rank(rank: int, rendezvous: str, drift: bool, out: dict) -> None:
    import torch
    import torch.distributed as dist

    from vlmrl.workers.hybrid import HybridWorker

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    torch.manual_seed(7)  # as HybridWorker seeds an engine group
    if drift and rank == 1:
        torch.rand(1)  # something on one rank only draws a random number
    worker = types.SimpleNamespace(tp=2, world=2, engine_group=0, device="cpu")
    try:
        HybridWorker._check_engine_group_in_step(worker)  # type: ignore[arg-type]
        out[rank] = "ok"
    except RuntimeError as e:
        out[rank] = str(e)
    dist.destroy_process_group()


@pytest.mark.parametrize("drift", [False, True], ids=["in-step", "one-rank-drew"])
def test_an_engine_groups_workers_must_hold_the_same_random_state(tmp_path: Path, drift: bool) -> None:
    """vLLM samples from each process's torch generator: the workers sharing a tensor-parallel engine must hold the
    same state at every rollout, or each samples its own tokens into one forward. A rank that drew a random number
    the others did not is caught before the rollout, on every rank of the group."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        procs = [ctx.Process(target=_guard_rank, args=(r, f"file://{tmp_path / 'rdv'}", drift, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        results = dict(out)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    if drift:
        assert all("engine 0 hold different random states" in results[r] for r in range(2)), results
    else:
        assert results == {0: "ok", 1: "ok"}


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    return make_colour_data(tmp_path_factory.mktemp("colour"))


def _val_responses(folder: Path, step: int) -> list[str]:
    lines = (folder / f"step_{step:06d}.jsonl").read_text().splitlines()
    return [json.loads(line)["response"] for line in lines]


@pytest.mark.slow
def test_tensor_parallel_engine_samples_and_trains_exactly(tiny_model_dir, colour_data, tmp_path: Path) -> None:
    """2 CPU workers sharing one vLLM engine of tensor-parallel size 2 (each holding half of it): greedy validation
    before training answers exactly as two engines of size 1 do, and after every weight push the engine's log-probs
    of what it sampled equal the trainer's (drift < 1e-3): the pushed full tensors land as the right shards."""
    runs = {}
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}"
        run = run_to_end(
            base_args(
                tiny_model_dir, colour_data, out, "trainer.total_training_steps=3", "trainer.test_freq=3",
                "trainer.val_before_train=true", f"trainer.validation_data_dir={out / 'val'}",
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            ),
            timeout=600,
        )  # fmt: skip
        runs[tp] = (out, run.output())
    out2, log2 = runs[2]
    assert "2 hybrid worker(s) on cpu" in log2 and "1 vLLM engine(s) of tensor-parallel size 2" in log2, log2[-3000:]
    assert "2 vLLM engine(s) of tensor-parallel size 1" in runs[1][1]
    before = _val_responses(runs[1][0] / "val", 0)
    assert _val_responses(out2 / "val", 0) == before and len(set(before)) > 5
    rows = [r for r in metrics(out2) if "rollout/logprob_diff" in r]
    assert len(rows) == 3 and all(r["rollout/logprob_diff"] < 1e-3 for r in rows), rows
    assert all(r["actor/grad_norm"] > 0 for r in rows)
