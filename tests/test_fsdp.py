"""FSDP2 settings that must not change what is learned, only what it costs: ``reshard_after_forward=False`` (keep
each unit's gathered weights from its forward to its backward) and ``wrap_policy.min_num_params`` (small layers
gathered with their parent: fewer units) and ``fsdp_size=1`` (a whole copy per worker, gradients all-reduced) train
exactly as the default does. reshard_after_forward=False once trained nothing: the optimizer was built while the units
were still gathered and stepped copies the next gather overwrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_micro_batches import varied_batch  # noqa: F401 - the fixture

from runs import processes
from vlmrl.config import ActorRolloutRefConfig
from vlmrl.models import qwen_vl

SETTINGS = ("default", "reshard_after_forward=False", "min_num_params=1e6")


def _run_alone(target, *args, tmp_path: Path) -> tuple[int | None, dict]:
    """``target(*args, rendezvous, out)`` in one process of its own (a world of one; tests/runs.processes); its exit
    code and ``out``."""
    ctx = processes()
    with ctx.Manager() as manager:
        out = manager.dict()
        p = ctx.Process(target=target, args=(*args, f"file://{tmp_path / 'rdv'}", out))
        p.start()
        p.join(300)
        return p.exitcode, dict(out)


def _worker(model_dir: str, vision_ids, micro: int, min_num_params: int = 0, **fsdp) -> Any:
    """A PolicyWorker on the tiny model (no checkpointing, no shuffle, lr 1e-2, ``micro`` samples per micro-batch,
    these ``fsdp_config`` values), its weights from seed 0."""
    from vlmrl.workers.policy import PolicyWorker

    arr = ActorRolloutRefConfig()
    arr.model.path = model_dir
    arr.model.enable_gradient_checkpointing = False
    for key, value in fsdp.items():
        setattr(arr.actor.fsdp_config, key, value)
    arr.actor.fsdp_config.wrap_policy.min_num_params = min_num_params
    arr.actor.ppo_micro_batch_size_per_gpu = micro
    arr.actor.shuffle = False
    arr.actor.optim.lr = 1e-2
    torch.manual_seed(0)
    return PolicyWorker(arr, device="cpu", total_steps=4, vision_ids=vision_ids, seed=1, max_response_length=22)


def _train(model_dir: str, vision_ids, x, advantages, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist

    from vlmrl.models.forward import response_logprobs
    from vlmrl.workers.policy import PolicyWorker
    from vlmrl.workers.weights import engine_weights

    dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    for setting in SETTINGS:
        worker = _worker(
            model_dir,
            vision_ids,
            3,
            reshard_after_forward=setting != "reshard_after_forward=False",
            min_num_params=10**6 if setting == "min_num_params=1e6" else 0,
        )

        def logprobs(w: PolicyWorker) -> torch.Tensor:
            with torch.no_grad():
                return response_logprobs(w.model, x, vision_ids)[0]

        before = logprobs(worker)
        for _ in range(2):  # two updates of two mini-batches each: four optimizer steps
            worker.update(x, advantages, 6)
        from torch.distributed.fsdp import FSDPModule

        kept = list(engine_weights(worker.model))  # held past each unit's reshard, as vLLM's reload holds some
        out[setting] = {
            "before": before,
            "after": logprobs(worker),
            "pushed": {name: t.clone() for name, t in engine_weights(worker.model)},
            "kept": {name: t for name, t in kept},
            "units": sum(isinstance(m, FSDPModule) for m in worker.model.modules()),
        }
    dist.destroy_process_group()


def test_cheaper_fsdp_settings_train_exactly_as_the_default(
    tiny_model_dir,
    tiny_processor,
    varied_batch,  # noqa: F811
    tmp_path: Path,
) -> None:
    x, advantages = varied_batch
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    exitcode, results = _run_alone(_train, str(tiny_model_dir), ids, x, advantages, tmp_path=tmp_path)
    assert exitcode == 0 and set(results) == set(SETTINGS), exitcode
    default = results["default"]
    mask = x.response_mask.bool()
    moved = float((default["after"] - default["before"])[mask].abs().max())
    assert moved > 1e-2, moved  # the updates changed what the model computes
    # 2 decoder layers + 2 vision blocks + the tower + the root; 1e6 folds the layers into the tower and the root
    assert default["units"] == 6 and results["min_num_params=1e6"]["units"] == 2
    for result in results.values():  # what the push yielded is still there after its unit was resharded
        assert all(torch.equal(result["kept"][k], t) for k, t in result["pushed"].items())
    for setting in SETTINGS[1:]:
        other = results[setting]
        assert torch.equal(default["before"], other["before"])
        gap = float((other["after"] - default["after"])[mask].abs().max())
        assert gap <= 1e-5, (setting, gap)  # ... and changed it alike
        assert default["pushed"].keys() == other["pushed"].keys()
        worst = max(float((default["pushed"][k] - other["pushed"][k]).abs().max()) for k in default["pushed"])
        assert worst <= 1e-5, (setting, worst)  # the engine gets the same new weights


def _clip_worker(rank: int, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    from vlmrl.models.trainable import clip_grad_norm

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    results = {}
    for case, scale in (("clipped", 10.0), ("under the limit", 1e-3), ("non-finite", float("inf"))):
        torch.manual_seed(0)  # the same model on both ranks; gradients differ per rank (as data-parallel ones do)
        models = [torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3)) for _ in range(2)]
        models[1].load_state_dict(models[0].state_dict())
        for m in models:
            fully_shard(m)
        for m in models:
            g = torch.Generator().manual_seed(10 + rank)
            for p in m.parameters():
                full = torch.randn(p.full_tensor().shape, generator=g) * (scale if scale != float("inf") else 1.0)
                if scale == float("inf") and p.dim() == 1:
                    full[0] = float("inf")
                p.grad = distribute_tensor(full, p.device_mesh, p.placements)
        theirs = torch.nn.utils.clip_grad_norm_(list(models[0].parameters()), 1.0, foreach=True)
        theirs = float(theirs.full_tensor() if hasattr(theirs, "full_tensor") else theirs)
        ours = clip_grad_norm(list(models[1].parameters()), 1.0)
        after = [
            (a.grad.full_tensor(), b.grad.full_tensor()) for a, b in zip(models[0].parameters(), models[1].parameters())
        ]
        results[case] = (theirs, ours, after)
    out[rank] = results
    dist.destroy_process_group()


def test_clip_grad_norm_on_local_shards_equals_torchs(tmp_path: Path) -> None:
    """vlmrl clips FSDP2 gradients on their local shards (one all-reduce, no per-op DTensor dispatch): the same
    global norm and the same clipped gradients as ``torch.nn.utils.clip_grad_norm_`` on 2 ranks whose gradients
    differ, when clipping, when under the limit (unchanged) and with an inf gradient (a non-finite norm)."""
    import math

    ctx = processes()
    with ctx.Manager() as manager:
        out = manager.dict()
        rdv = f"file://{tmp_path / 'rdv'}"
        procs = [ctx.Process(target=_clip_worker, args=(r, rdv, out)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        results = dict(out)
    assert [p.exitcode for p in procs] == [0, 0] and set(results) == {0, 1}
    for rank in (0, 1):
        r = results[rank]
        theirs, ours, after = r["clipped"]
        assert theirs > 10 and math.isclose(ours, theirs, rel_tol=1e-6), (theirs, ours)
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in after)
        theirs, ours, after = r["under the limit"]
        assert theirs < 1 and math.isclose(ours, theirs, rel_tol=1e-6)
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in after)
        theirs, ours, _ = r["non-finite"]
        assert not math.isfinite(theirs) and not math.isfinite(ours)
    assert results[0]["clipped"][1] == results[1]["clipped"][1]  # every rank sees the same global norm


def _push_and_train(model_dir: str, vision_ids, x, advantages, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from vlmrl.models.forward import response_logprobs
    from vlmrl.workers.weights import engine_weights

    dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    for keep in (False, True):
        worker = _worker(model_dir, vision_ids, 3, reshard_after_forward=False)
        pushes, gathered = [], []
        for _ in range(3):  # update (two optimizer steps), then a push, as every training step does
            worker.update(x, advantages, 6)
            pushes.append({name: t.clone() for name, t in engine_weights(worker.model, keep_gathered=keep)})
            gathered.append(sum(not isinstance(p, DTensor) for p in worker.model.parameters()))  # gathered: plain
        with torch.no_grad():
            after = response_logprobs(worker.model, x, vision_ids)[0]
        worker.update(x, advantages, 6)
        list(worker.engine_weights())  # the push a CPU worker makes
        out[keep] = {
            "pushes": pushes,
            "gathered": gathered,
            "after": after,
            "cpu_push_keeps": sum(not isinstance(p, DTensor) for p in worker.model.parameters()),
        }
    dist.destroy_process_group()


def test_units_kept_gathered_after_a_push_train_exactly_as_resharded_ones(
    tiny_model_dir,
    tiny_processor,
    varied_batch,  # noqa: F811
    tmp_path: Path,
) -> None:
    """On CPU the push leaves the FSDP units gathered, so the next update's forward gathers nothing. Its weights
    are the pushed ones (no optimizer step comes between), and every backward reshards: three rounds of update +
    push give exactly the pushes and the model of a run that reshards after each push."""
    x, advantages = varied_batch
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    exitcode, results = _run_alone(_push_and_train, str(tiny_model_dir), ids, x, advantages, tmp_path=tmp_path)
    assert exitcode == 0 and set(results) == {False, True}, exitcode
    resharded, kept = results[False], results[True]
    assert resharded["gathered"] == [0, 0, 0] and all(n > 0 for n in kept["gathered"])
    assert resharded["cpu_push_keeps"] > 0  # PolicyWorker.engine_weights keeps them gathered on CPU
    assert len({tuple(float(t.sum()) for t in push.values()) for push in kept["pushes"]}) == 3  # weights moved
    for a, b in zip(resharded["pushes"], kept["pushes"]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(resharded["after"], kept["after"])


def _hsdp_worker(rank: int, model_dir: str, vision_ids, x, advantages, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from vlmrl.models.forward import response_logprobs

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    rows = list(range(rank, x.batch_size, 2))  # each rank its half of the samples, as the workers get theirs
    mine, adv = x.select(rows), advantages[rows]
    for fsdp_size in (-1, 1):
        worker = _worker(model_dir, vision_ids, 2, fsdp_size=fsdp_size)
        params = [p for p in worker.model.parameters() if isinstance(p, DTensor)]
        whole = [tuple(p.to_local().shape) == tuple(p.shape) for p in params]
        for _ in range(2):  # two updates of two mini-batches each: four optimizer steps
            worker.update(mine, adv, 3)
        with torch.no_grad():
            after = response_logprobs(worker.model, x, vision_ids)[0]
        out[rank, fsdp_size] = {
            "after": after,
            "pushed": {name: t.clone() for name, t in worker.engine_weights()},
            "whole_locals": sum(whole),
            "params": len(params),
            "mesh": tuple(params[0].device_mesh.shape),
        }
    dist.destroy_process_group()


@pytest.mark.slow  # 17.7 s measured on a clean clone (tests/durations.json): 2 spawned workers, 2 trainings
def test_fsdp_size_1_holds_the_whole_model_per_worker_and_trains_as_sharding_does(
    tiny_model_dir,
    tiny_processor,
    varied_batch,  # noqa: F811
    tmp_path: Path,
) -> None:
    """verl's ``fsdp_size``: with 1, each of 2 workers holds every parameter whole (a 2 x 1 mesh: replicas, no
    shard to gather) and the gradients are all-reduced; its updates equal those of the default sharding over both
    workers (log-probs within 1e-5, pushed weights within 2e-4 after four Adam steps at lr 1e-2, fp32). A size that
    does not divide the workers is refused at the gate, naming the key."""
    from vlmrl.config import load
    from vlmrl.config.checks import batch_problems

    x, advantages = varied_batch
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    ctx = processes()
    with ctx.Manager() as manager:
        out = manager.dict()
        rdv = f"file://{tmp_path / 'rdv'}"
        args = (str(tiny_model_dir), ids, x, advantages, rdv, out)
        procs = [ctx.Process(target=_hsdp_worker, args=(r, *args)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        results = dict(out)
    assert [p.exitcode for p in procs] == [0, 0] and len(results) == 4
    mask = x.response_mask.bool()
    for rank in (0, 1):
        sharded, whole = results[rank, -1], results[rank, 1]
        assert sharded["mesh"] == (2,) and whole["mesh"] == (2, 1)
        assert whole["whole_locals"] == whole["params"] and sharded["whole_locals"] < sharded["params"]
        assert float((whole["after"] - sharded["after"])[mask].abs().max()) <= 1e-5
        # the gradients are summed in another order (an all-reduce, not a reduce-scatter); Adam divides each by its
        # own running scale, which carries that rounding of near-zero gradients into the weights: 4.5e-5 measured
        worst = max(float((whole["pushed"][k] - t).abs().max()) for k, t in sharded["pushed"].items())
        assert whole["pushed"].keys() == sharded["pushed"].keys() and worst <= 2e-4, worst
    assert all(torch.equal(results[0, 1]["pushed"][k], t) for k, t in results[1, 1]["pushed"].items())

    line = ["data.train_files=x", "actor_rollout_ref.model.path=m", "trainer.device=cpu", "trainer.cpu_workers=2"]
    for size, refused in ((3, True), (2, False), (1, False), (-1, False)):
        cfg = load([*line, f"actor_rollout_ref.actor.fsdp_config.fsdp_size={size}"])
        problems = [p for p in batch_problems(cfg) if "fsdp_size" in p]
        assert bool(problems) == refused, problems
        assert not refused or "actor.fsdp_config.fsdp_size=3: the workers each parameter is sharded" in problems[0]
