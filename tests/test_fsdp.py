"""FSDP2 settings that must not change what is learned: ``reshard_after_forward=False`` (keep each unit's gathered
weights from its forward to its backward) trains exactly as the default does. It once trained nothing: the
optimizer was built while the units were still gathered and stepped copies that the next gather overwrote."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import torch
from test_micro_batches import varied_batch  # noqa: F401 - the fixture

from vlmrl.config import ActorRolloutRefConfig
from vlmrl.models import qwen_vl


def _train(model_dir: str, vision_ids, x, advantages, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist

    from vlmrl.models.forward import response_logprobs
    from vlmrl.workers.policy import PolicyWorker

    dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    for reshard in (True, False):
        arr = ActorRolloutRefConfig()
        arr.model.path = model_dir
        arr.model.enable_gradient_checkpointing = False
        arr.actor.fsdp_config.reshard_after_forward = reshard
        arr.actor.ppo_micro_batch_size_per_gpu = 3
        arr.actor.shuffle = False
        arr.actor.optim.lr = 1e-2
        torch.manual_seed(0)
        worker = PolicyWorker(arr, device="cpu", total_steps=4, vision_ids=vision_ids, seed=1, max_response_length=22)

        def logprobs(w: PolicyWorker) -> torch.Tensor:
            with torch.no_grad():
                return response_logprobs(w.model, x, vision_ids)[0]

        before = logprobs(worker)
        for _ in range(2):  # two updates of two mini-batches each: four optimizer steps
            worker.update(x, advantages, 6)
        out[reshard] = {
            "before": before, "after": logprobs(worker),
            "pushed": {name: t.clone() for name, t in worker.engine_weights()},
        }  # fmt: skip
    dist.destroy_process_group()


def test_reshard_after_forward_false_trains_exactly_as_the_default(tiny_model_dir, tiny_processor, varied_batch,  # noqa: F811
                                                                    tmp_path: Path) -> None:  # fmt: skip
    x, advantages = varied_batch
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        rdv = f"file://{tmp_path / 'rdv'}"
        p = ctx.Process(target=_train, args=(str(tiny_model_dir), ids, x, advantages, rdv, out))
        p.start()
        p.join(300)
        results = dict(out)
    assert p.exitcode == 0 and set(results) == {True, False}, p.exitcode
    default, kept = results[True], results[False]
    mask = x.response_mask.bool()
    assert torch.equal(default["before"], kept["before"])
    moved = float((default["after"] - default["before"])[mask].abs().max())
    assert moved > 1e-2, moved  # the updates changed what the model computes
    assert float((kept["after"] - default["after"])[mask].abs().max()) <= 1e-5  # ... and changed it alike
    assert default["pushed"].keys() == kept["pushed"].keys()
    worst = max(float((default["pushed"][k] - kept["pushed"][k]).abs().max()) for k in default["pushed"])
    assert worst <= 1e-5, worst  # the engine gets the same new weights
