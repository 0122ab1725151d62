"""Padding-free forwards (``actor_rollout_ref.model.use_remove_padding=True``, ``vlmrl.models.packing``): the varlen
attention against a dense masked attention, and the packed forward against the padded forwards in log-probs, loss
and gradients (fp32, <= 1e-5) on image, two-image, text-only, video and image+video prompts, with gradient
checkpointing and LoRA. Multi-turn tool images: tests/test_multi_turn.py; the policy update with token-budget
micro-batches: tests/test_micro_batches.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText
from utils import clip, make_prompt, noise, solid, video_prompt

from vlmrl.models import forward, packing, qwen_vl
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout

# ---------------------------------------------------------------------------------------------- the attention


class _Heads(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("layout", ["shared", "rows"])
def test_varlen_attention_equals_a_dense_mask_over_the_row(layout) -> None:
    """Each segment attends causally to itself after its prefix (a shared prompt) and to nothing else: equal, in
    value and gradient, to one sdpa over the row with that block mask written out (grouped-query heads)."""
    torch.manual_seed(0)
    # 2 prompts (left-padded to 4 columns: lengths 4 and 3) x responses (right-padded to 3: lengths 2, 3, 1, 0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0, 0]])
    if layout == "shared":
        packed = packing.pack_shared(mask, 3, [0, 2], [0, 0, 1, 1])
        assert packed.segments.bounds == [0, 4, 7, 9, 12, 13, 13]
        assert packed.segments.prefixes == [(0, 0), (0, 0), (0, 4), (0, 4), (4, 7), (4, 7)]
    else:
        packed = packing.pack_rows(mask, 3)
        assert packed.segments.bounds == [0, 6, 13, 17, 20]
    bounds, prefixes = packed.segments.bounds, packed.segments.prefixes
    T = bounds[-1]
    q = torch.randn(1, 4, T, 8, requires_grad=True)
    k = torch.randn(1, 2, T, 8, requires_grad=True)
    v = torch.randn(1, 2, T, 8, requires_grad=True)
    out, _ = packing.varlen_attention(_Heads(), q, k, v, None, scaling=0.3, vlmrl_segments=packed.segments)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for (a, b), (pa, pb) in zip(zip(bounds[:-1], bounds[1:]), prefixes):
        mask[a:b, pa:pb] = True
        mask[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    assert out.shape == (1, T, 4, 8)
    assert (out - ref).abs().max() <= 1e-6
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * g).sum(), (q, k, v))
    assert max(float((a - b).abs().max()) for a, b in zip(grads, ref_grads)) <= 1e-5
    # flash-attention's key layout (its kernel runs on CUDA only): per segment its prefix's keys, then its own,
    # attended with queries aligned to the last key, is the same attention
    keys, cu_k, cu_q = packed.segments.flash_keys()
    assert cu_q.tolist() == bounds and cu_k.dtype == cu_q.dtype == torch.int32
    kk, vv = k.repeat_interleave(2, 1)[0, :, keys], v.repeat_interleave(2, 1)[0, :, keys]
    emulated = []
    for s in range(len(bounds) - 1):
        qa, qb, ka, kb = bounds[s], bounds[s + 1], int(cu_k[s]), int(cu_k[s + 1])
        if qb > qa:
            aligned = torch.ones(qb - qa, kb - ka, dtype=torch.bool).tril(kb - ka - (qb - qa))
            emulated.append(
                torch.nn.functional.scaled_dot_product_attention(
                    q[0, :, qa:qb], kk[:, ka:kb], vv[:, ka:kb], attn_mask=aligned, scale=0.3
                ).transpose(0, 1)
            )
    assert (torch.cat(emulated) - ref[0]).abs().max() <= 1e-6
    # no segments: transformers' sdpa, unchanged
    plain, _ = packing.varlen_attention(_Heads(), q, k, v, None, scaling=0.3, is_causal=True)
    ref_plain = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    ).transpose(1, 2)
    assert (plain - ref_plain).abs().max() <= 1e-6


def test_packing_refuses_holes_and_models_without_varlen_attention(tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        packing.pack_rows(torch.tensor([[0, 1, 0, 1, 1]]), 2)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)  # plain sdpa
    assert not packing.supports_packing(model)
    with pytest.raises(ValueError, match="use_remove_padding=True needs the model loaded with vlmrl's varlen"):
        forward.packed_logits(model, None, None)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------- the forward


def _batch(processor, model, kind: str):
    """A rollout's ModelInputs with mixed prompts and uneven lengths, rows reordered and one dropped."""
    if kind == "images":
        prompts = [
            make_prompt(processor, "What colour is the shape?", [solid((0, 200, 0))], 0),
            make_prompt(processor, "Two pictures, longer question text here.", [noise(5), noise(6, (56, 112))], 1),
            make_prompt(processor, "Text only.", [], 2),
            # the same token ids as prompt 0 with another image: its samples must not share prompt 0's features
            make_prompt(processor, "What colour is the shape?", [solid((200, 0, 0))], 3),
        ]
    else:
        prompts = [
            video_prompt(processor, "What happens?", [clip(6)], fps=1.5, index=0),
            video_prompt(processor, "Picture and clip.", [clip(4, (56, 112), 20)], 3.0, images=[noise(3)], index=1),
            video_prompt(processor, "Text only: say hi.", [], 2.0, index=2),
        ]
    rb = HFRollout(model.eval(), processor).generate(prompts, SamplingSpec(n=3, max_tokens=9))
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    rows = [1, 0, 4, 3, 8, 6, 7] + ([9, 11] if kind == "images" else [])
    return x.select(rows), [rb.logprobs[r] for r in rows]


@pytest.mark.parametrize("kind", ["images", "video"])
@pytest.mark.parametrize("variant", ["plain", "checkpointing", "lora"])
def test_packed_forward_equals_the_padded_forwards(tiny_processor, tiny_model_dir, kind, variant) -> None:
    """Same per-token log-probs, PPO loss and parameter gradients (fp32, <= 1e-5) as the padded forwards (full
    sequences, and each prompt once with its KV cache shared), and the same log-probs the sampler reported; no
    padding position runs."""
    from vlmrl.algorithms.losses import LossConfig, get_policy_loss

    torch.manual_seed(3)
    model = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=packing.VARLEN
    )
    if variant == "lora":  # peft wraps the model: the packed kwargs must still reach the attention
        from vlmrl.config import ModelConfig
        from vlmrl.workers.lora import apply_lora

        model = apply_lora(model, ModelConfig(path="tiny", lora_rank=4, lora_alpha=8))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
    assert packing.supports_packing(model)
    x, engine_lp = _batch(tiny_processor, model, kind)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    mask = x.response_mask
    adv = torch.linspace(-1.0, 1.0, x.batch_size)[:, None].expand(mask.shape)
    loss_fn = get_policy_loss("vanilla")
    out = {}
    forwards = {
        "full": forward.full_sequence_logits,
        "shared": forward.shared_sample_logits,
        "packed": forward.packed_logits,
    }
    for name, fn in forwards.items():
        if variant == "checkpointing" and name != "shared":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train().zero_grad()
        logits, extra = fn(model, x, ids)
        lp = forward.token_logprobs(logits, x.responses)
        pg, _ = loss_fn(lp.detach() - 0.05 * mask, lp, adv, mask, "token-mean", LossConfig())
        (pg + extra).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        out[name] = (lp.detach() * mask, float(pg.detach()), grads)
        if variant == "checkpointing":
            model.gradient_checkpointing_disable()
    for name in ("full", "shared"):
        assert (out["packed"][0] - out[name][0]).abs().max() <= 1e-5, name
        assert abs(out["packed"][1] - out[name][1]) <= 1e-5, name
        assert out["packed"][2].keys() == out[name][2].keys() and len(out[name][2]) >= 4
        worst = max(float((out["packed"][2][k] - out[name][2][k]).abs().max()) for k in out[name][2])
        assert worst <= 1e-5, (name, worst)
    assert any(float(g.abs().max()) > 1e-4 for g in out["packed"][2].values()), "gradients must not be zero"
    for k, ref in enumerate(engine_lp):
        assert (out["packed"][0][k, : len(ref)] - torch.tensor(ref)).abs().max() < 1e-5
    real, padding = forward.forward_token_counts(x, model, packed=True)
    padded_real, padded_padding = forward.forward_token_counts(x, model.eval(), packed=False)
    assert padding == 0 and padded_padding > 0 and real == padded_real  # the same tokens, minus the padding
    # the policy's entry point takes the switch
    lp, _, _ = forward.response_logprobs(model.eval(), x, ids, packed=True)
    assert torch.allclose(lp.detach() * mask, out["packed"][0], atol=1e-6)
