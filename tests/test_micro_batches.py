"""Token-budget micro-batches (verl's ``use_dynamic_bsz``): the split itself, and an update that gives the same loss
and gradients as fixed-size micro-batches on the same data (fp32, <= 1e-5), in token-mean and seq-mean modes, with
the KL reference and old log-probs going through their own budgets."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForImageTextToText
from utils import make_prompt, noise, solid

from vlmrl.config import ActorRolloutRefConfig
from vlmrl.models import qwen_vl
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout
from vlmrl.workers import micro_batches
from vlmrl.workers.policy import PolicyWorker

# ---------------------------------------------------------------------------------------------------- the split


def test_by_tokens_keeps_every_micro_batch_within_its_padded_budget() -> None:
    rows = list(range(10))
    prompts = [30, 30, 30, 30, 50, 50, 50, 50, 10, 10]
    responses = [5, 60, 7, 40, 2, 2, 90, 3, 1, 100]
    p, r = dict(zip(rows, prompts)), dict(zip(rows, responses))
    batches = micro_batches.by_tokens(rows, prompts, responses, 300, "budget")
    assert sorted(x for b in batches for x in b) == rows  # every sample exactly once
    assert all(micro_batches.padded_tokens(b, p, r) <= 300 for b in batches)
    assert all(b == sorted(b) for b in batches)  # original order inside a micro-batch
    # fixed runs of 3 pad to each run's longest: more computed tokens than the budgeted split
    fixed = micro_batches.fixed(rows, 3)
    assert sum(micro_batches.padded_tokens(b, p, r) for b in fixed) > sum(
        micro_batches.padded_tokens(b, p, r) for b in batches
    )
    with pytest.raises(ValueError, match=r"actor.ppo_max_token_len_per_gpu=100 is smaller than one sample of 140"):
        micro_batches.by_tokens(rows, prompts, responses, 100, "actor.ppo_max_token_len_per_gpu")


def test_packed_budgets_count_real_tokens_with_each_prompt_once() -> None:
    """With packing (``use_remove_padding=True``) a budget counts what the packed forward runs, as verl's does:
    samples stay in order (a GRPO group together, its prompt once) and no padding is counted."""
    rows = list(range(8))
    prompt_of = [0, 0, 0, 0, 1, 1, 1, 1]
    prompts = [40] * 4 + [10] * 4
    responses = [5, 60, 7, 40, 2, 2, 90, 3]
    batches = micro_batches.by_tokens(rows, prompts, responses, 150, "budget", prompt_of)
    # 40 + 5 + 60 + 7 = 112 (one more: 152); 40 + 40 + 10 + 2 + 2 = 94 (one more: 184); 10 + 90 + 3 = 103
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7]]
    p, r, q = dict(zip(rows, prompts)), dict(zip(rows, responses)), dict(zip(rows, prompt_of))
    assert [micro_batches.packed_tokens(b, p, r, q) for b in batches] == [112, 94, 103]
    assert micro_batches.padded_tokens([0, 1, 2], p, r) == 300  # what the padded count would charge
    split = micro_batches.split_to(batches, 4, p, r, q)  # another rank needs 4: the costliest (112) splits
    assert split[0] == [1] and split[1] == [0, 2] and sorted(x for b in split for x in b) == rows
    with pytest.raises(ValueError, match=r"budget=50 is smaller than one sample of 100 tokens"):
        micro_batches.by_tokens(rows, prompts, responses, 50, "budget", prompt_of)


def test_split_to_reaches_the_count_another_rank_needs() -> None:
    rows = list(range(6))
    p = dict.fromkeys(rows, 10)
    r = dict(zip(rows, [1, 2, 3, 50, 60, 70]))
    batches = micro_batches.by_tokens(rows, list(p.values()), list(r.values()), 10_000, "k")
    assert len(batches) == 1
    split = micro_batches.split_to(batches, 4, p, r)
    assert len(split) == 4 and all(split) and sorted(x for b in split for x in b) == rows
    with pytest.raises(ValueError, match="cannot make 7 micro-batches of 6 samples"):
        micro_batches.split_to(batches, 7, p, r)


# ------------------------------------------------------------------------------------------- same update, faster


@pytest.fixture(scope="module")
def varied_batch(tiny_processor, tiny_model_dir):
    """Three prompts (one image, two images, text only) x 4 samples with responses of 1 to 22 tokens."""
    torch.manual_seed(5)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [solid((0, 200, 0))], 0),
        make_prompt(tiny_processor, "Two pictures, a longer question here.", [noise(1), noise(2, (56, 112))], 1),
        make_prompt(tiny_processor, "Text only.", [], 2),
    ]
    rb = HFRollout(model, tiny_processor).generate(prompts, SamplingSpec(n=4, max_tokens=22, ignore_eos=True))
    lengths = [22, 1, 9, 3, 17, 2, 12, 5, 20, 7, 14, 4]
    rb.response_ids = [ids[:n] for ids, n in zip(rb.response_ids, lengths)]
    rb.logprobs = [lp[:n] for lp, n in zip(rb.logprobs, lengths)]
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    advantages = torch.linspace(-1.0, 1.0, x.batch_size)
    return x, advantages


def _update(worker: PolicyWorker, x, advantages, mini_batch_samples: int):
    """Run one update; the optimizer's step records the gradients instead of applying them (so both runs start
    from the same weights); returns the gradients of each optimizer step, the metrics and the micro-batches used."""
    grads: list[dict[str, torch.Tensor]] = []
    used: list[list[list[int]]] = []
    worker.optimizer.step = lambda *a, **k: grads.append(  # type: ignore[method-assign]
        {n: p.grad.detach().clone() for n, p in worker.model.named_parameters() if p.grad is not None}
    )
    plan = worker.micro_batches

    def spy(xx, rows, which):
        out = plan(xx, rows, which)
        used.append(out)
        return out

    worker.micro_batches = spy  # type: ignore[method-assign]
    metrics = worker.update(x, advantages, mini_batch_samples)
    del worker.micro_batches
    return grads, metrics, used


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_token_budget_update_equals_fixed_micro_batches(tiny_model_dir, tiny_processor, varied_batch, agg) -> None:
    x, advantages = varied_batch
    arr = ActorRolloutRefConfig()
    arr.model.path = str(tiny_model_dir)
    arr.model.enable_gradient_checkpointing = False
    arr.actor.loss_agg_mode = agg
    arr.actor.use_kl_loss = True  # the reference forward goes through its own budget
    arr.actor.kl_loss_coef = 0.1
    arr.actor.entropy_coeff = 0.01
    arr.actor.ppo_micro_batch_size_per_gpu = 3
    arr.actor.shuffle = False
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    torch.manual_seed(0)
    worker = PolicyWorker(arr, device="cpu", total_steps=4, vision_ids=ids, seed=1, max_response_length=22)
    # two mini-batches of 6 samples: off-policy, so the old log-probs are computed (the rollout's budget) too
    fixed_grads, fixed_metrics, fixed_used = _update(worker, x, advantages, 6)

    dyn = copy.deepcopy(arr)
    dyn.actor.use_dynamic_bsz = True
    dyn.actor.ppo_max_token_len_per_gpu = 2 * int(x.attention_mask.sum(-1).max())
    worker.arr = dyn
    worker.actor_cfg = dyn.actor
    dyn_grads, dyn_metrics, dyn_used = _update(worker, x, advantages, 6)

    assert [len(b) for u in dyn_used for b in u] != [len(b) for u in fixed_used for b in u]  # another split
    assert any(len({len(b) for b in u}) > 1 for u in dyn_used)  # micro-batches of different sizes
    assert len(fixed_grads) == len(dyn_grads) == 2
    for a, b in zip(fixed_grads, dyn_grads):
        assert a.keys() == b.keys() and len(a) > 4
        worst = max(float((a[k] - b[k]).abs().max()) for k in a)
        assert worst <= 1e-5, worst
        assert any(float(g.abs().max()) > 1e-4 for g in a.values())
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert dyn_metrics[key] == pytest.approx(fixed_metrics[key], abs=1e-5), key


@pytest.mark.parametrize("budget", [False, True], ids=["fixed", "token-budget"])
def test_packed_update_equals_the_padded_one(tiny_model_dir, tiny_processor, varied_batch, budget) -> None:
    """``use_remove_padding=True`` (verl's scripts set it): the same update as padded micro-batches (gradients of
    each optimizer step, loss, KL to the reference, entropy; fp32, <= 1e-5), with fixed or token-budget
    micro-batches and gradient checkpointing on; the update's forwards run the same real tokens and no padding."""
    x, advantages = varied_batch
    arr = ActorRolloutRefConfig()
    arr.model.path = str(tiny_model_dir)
    arr.model.enable_gradient_checkpointing = True
    arr.actor.use_kl_loss = True  # the reference's forward is packed too
    arr.actor.kl_loss_coef = 0.1
    arr.actor.entropy_coeff = 0.01
    arr.actor.ppo_micro_batch_size_per_gpu = 3
    arr.actor.use_dynamic_bsz = budget
    arr.actor.ppo_max_token_len_per_gpu = 2 * int(x.attention_mask.sum(-1).max())
    arr.actor.shuffle = False
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    torch.manual_seed(0)
    worker = PolicyWorker(arr, device="cpu", total_steps=4, vision_ids=ids, seed=1, max_response_length=22)
    assert worker.packed is False
    padded_grads, padded_metrics, used = _update(worker, x, advantages, 6)
    worker.packed = True  # what actor_rollout_ref.model.use_remove_padding=True sets
    packed_grads, packed_metrics, packed_used = _update(worker, x, advantages, 6)
    if budget:  # packed budgets count real tokens, each prompt once: fewer, larger micro-batches
        assert sum(map(len, packed_used)) < sum(map(len, used))
    else:
        assert packed_used == used
    assert len(padded_grads) == len(packed_grads) == 2
    for a, b in zip(padded_grads, packed_grads):
        assert a.keys() == b.keys() and len(a) > 4
        assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5
        assert any(float(g.abs().max()) > 1e-4 for g in a.values())
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/pg_clipfrac", "actor/ppo_kl"):
        assert packed_metrics[key] == pytest.approx(padded_metrics[key], abs=1e-5), key
    # checkpointing makes the padded update run every sample's whole sequence; the packed one runs each prompt once
    assert padded_metrics["work/update_padding_tokens"] > 0 and packed_metrics["work/update_padding_tokens"] == 0
    assert packed_metrics["work/update_tokens"] < padded_metrics["work/update_tokens"]
    # the same images encoded, or fewer where the packed budget keeps a prompt's samples together
    assert 0 < packed_metrics["work/update_vision_patches"] <= padded_metrics["work/update_vision_patches"]
    assert (packed_metrics["work/update_vision_patches"] == padded_metrics["work/update_vision_patches"]) is not budget
