"""FSDP2 settings that must not change what is learned, only what it costs: ``reshard_after_forward=False`` (keep
each unit's gathered weights from its forward to its backward) and ``wrap_policy.min_num_params`` (small layers
gathered with their parent: fewer units) train exactly as the default does. reshard_after_forward=False once trained
nothing: the optimizer was built while the units were still gathered and stepped copies the next gather overwrote."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import torch
from test_micro_batches import varied_batch  # noqa: F401 - the fixture

from vlmrl.config import ActorRolloutRefConfig
from vlmrl.models import qwen_vl

SETTINGS = ("default", "reshard_after_forward=False", "min_num_params=1e6")


def _train(model_dir: str, vision_ids, x, advantages, rendezvous: str, out: dict) -> None:
    import torch.distributed as dist

    from vlmrl.models.forward import response_logprobs
    from vlmrl.workers.policy import PolicyWorker

    dist.init_process_group("gloo", init_method=rendezvous, rank=0, world_size=1)
    for setting in SETTINGS:
        arr = ActorRolloutRefConfig()
        arr.model.path = model_dir
        arr.model.enable_gradient_checkpointing = False
        arr.actor.fsdp_config.reshard_after_forward = setting != "reshard_after_forward=False"
        arr.actor.fsdp_config.wrap_policy.min_num_params = 10**6 if setting == "min_num_params=1e6" else 0
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
        from torch.distributed.fsdp import FSDPModule

        kept = list(worker.engine_weights())  # held past each unit's reshard, as vLLM's reload holds some
        out[setting] = {
            "before": before, "after": logprobs(worker),
            "pushed": {name: t.clone() for name, t in worker.engine_weights()},
            "kept": {name: t for name, t in kept},
            "units": sum(isinstance(m, FSDPModule) for m in worker.model.modules()),
        }  # fmt: skip
    dist.destroy_process_group()


def test_cheaper_fsdp_settings_train_exactly_as_the_default(tiny_model_dir, tiny_processor, varied_batch,  # noqa: F811
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
    assert p.exitcode == 0 and set(results) == set(SETTINGS), p.exitcode
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
