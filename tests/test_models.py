"""The tiny Qwen2.5-VL and the model quirks: determinism, exploration, log-prob agreement HF/vLLM, dummy vision."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from utils import make_prompt, noise, solid

from vlmrl.batch import RolloutBatch
from vlmrl.models import forward, qwen_vl
from vlmrl.models.forward import response_logprobs
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout
from vlmrl.testing.tiny import TinySpec, build_tiny_model


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_model_is_deterministic_per_seed(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    c = build_tiny_model(tmp_path / "c", seed=4)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert _sha(a / "tokenizer.json") == _sha(b / "tokenizer.json")
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")
    size = sum(f.stat().st_size for f in a.iterdir())
    assert size < 5_000_000, size


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_tiny_model_loads_as_real_qwen25vl_and_explores(tiny_model_dir, tiny_processor, hf_model):
    proc = AutoProcessor.from_pretrained(tiny_model_dir)
    assert type(proc).__name__ == "Qwen2_5_VLProcessor"
    assert hf_model.config.model_type == "qwen2_5_vl"
    qwen_vl.check_model_type(hf_model.config, tiny_model_dir)
    tok = proc.tokenizer
    # every id decodes to something: no padded vocabulary rows a random policy could waste mass on
    assert hf_model.config.text_config.vocab_size == len(tok)
    ids = qwen_vl.vision_token_ids(tok)
    assert len({ids.image_pad, ids.video_pad, ids.vision_start, ids.vision_end}) == 4
    for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|box_start|>", "<|quad_end|>", "<|vision_pad|>"):
        assert tok.convert_tokens_to_ids(t) is not None
    # the untrained policy is near-uniform: first-token entropy close to log(V)
    p = make_prompt(proc, "What colour is the shape?", [solid((255, 0, 0))])
    rb = RolloutBatch([], [[]], [[]], ["stop"], n=1)
    enc = proc(text=[p.prompt_text], images=p.images, return_tensors="pt")
    rb.prompt_ids = [enc["input_ids"][0].tolist()]
    x = build_inputs([p], rb, process_images(proc, [p]), tok.pad_token_id)
    with torch.no_grad():
        _, ent, _ = response_logprobs(hf_model, x, ids, with_entropy=True)
    assert ent[0, 0] > 0.95 * math.log(len(tok)), (float(ent[0, 0]), math.log(len(tok)))
    assert TinySpec().head_init_std <= 0.05


def test_engine_prompt_ids_have_one_pad_per_image_and_expand_like_the_processor(tiny_processor):
    p = make_prompt(tiny_processor, "Compare the pictures.", [noise(1), noise(2, (56, 112))])
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    assert qwen_vl.count_image_pads(p.prompt_ids, ids.image_pad) == 2
    enc = tiny_processor(text=[p.prompt_text], images=p.images, return_tensors="pt")
    per_image = qwen_vl.tokens_per_image(enc["image_grid_thw"], tiny_processor.image_processor.merge_size)
    assert qwen_vl.expand_image_pads(p.prompt_ids, ids.image_pad, per_image) == enc["input_ids"][0].tolist()
    ip = tiny_processor.image_processor
    lo, hi = qwen_vl.pixel_bounds(ip)
    for orig, n in zip(p.original_sizes, per_image):
        assert qwen_vl.num_image_tokens(*orig, qwen_vl.patch_factor(ip), lo, hi) == n


def test_hf_forward_logprobs_equal_generate_logprobs(tiny_processor, hf_model):
    """The trainer's forward (shared image features, M-RoPE from mm_token_type_ids, left/right padding) reproduces the
    log-probs HF generate reported for its own samples."""
    torch.manual_seed(1)
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [solid((255, 0, 0))], 0),
        make_prompt(tiny_processor, "Describe both.", [noise(3), noise(4, (112, 56))], 1),
        make_prompt(tiny_processor, "Text only: say hi.", [], 2),
    ]
    rollout = HFRollout(hf_model, tiny_processor)
    rb = rollout.generate(prompts, SamplingSpec(n=4, max_tokens=12, temperature=1.0))
    assert len(rb) == 12 and all(len(r) > 0 for r in rb.response_ids)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = response_logprobs(hf_model, x, ids)
    worst = 0.0
    for i, ref in enumerate(rb.logprobs):
        got = lp[i, : len(ref)]
        worst = max(worst, float((got - torch.tensor(ref)).abs().max()))
    print(f"max |lp_forward - lp_generate| = {worst:.2e}")
    assert worst <= 1e-5


def test_text_only_micro_batch_runs_dummy_vision_with_identical_loss(tiny_processor, tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    p = make_prompt(tiny_processor, "Text only.", [], 0)
    rb = RolloutBatch([p.prompt_ids], [[10, 11, 12]], [[0.0] * 3], ["length"], n=1)
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    logits = forward.forward_logits(model, x.input_ids, x.attention_mask, ids)
    plain = torch.log_softmax(logits[:, -4:-1].float(), -1).gather(-1, x.responses[..., None]).sum()
    lp, _, extra = response_logprobs(model, x, ids)
    assert float(extra) == 0.0
    loss = -(lp.sum()) + extra
    assert torch.allclose(loss, -plain, atol=1e-6)
    loss.backward()
    vis_grads = [q.grad for q in qwen_vl.vision_tower(model).parameters()]
    assert all(g is not None for g in vis_grads), "dummy pass must reach every vision parameter"
    assert all(float(g.abs().sum()) == 0.0 for g in vis_grads)


@pytest.mark.vllm
def test_vllm_samples_with_image_and_logprobs_match_hf_forward(tiny_model_dir, tiny_processor, hf_model):
    from vlmrl.config import RolloutConfig
    from vlmrl.rollout.vllm import VLLMRollout

    engine = VLLMRollout(tiny_model_dir, rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=1)
    p = make_prompt(tiny_processor, "What colour is the shape?", [noise(7)], 0)
    rb = engine.generate([p], SamplingSpec(n=4, max_tokens=16, temperature=1.0))
    assert len(rb) == 4 and len({tuple(r) for r in rb.response_ids}) > 1
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    enc = tiny_processor(text=[p.prompt_text], images=p.images, return_tensors="pt")
    assert rb.prompt_ids[0] == enc["input_ids"][0].tolist(), "engine must expand the single pad like the processor"
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _, _ = response_logprobs(hf_model, x, ids)
    worst = max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs))
    print(f"max |lp_vllm - lp_hf| = {worst:.2e}")
    assert worst <= 1e-4
    # the same forward with 1-D positions (M-RoPE inputs dropped) disagrees: the check above can fail
    with torch.no_grad():
        out = hf_model(
            input_ids=x.input_ids,
            attention_mask=x.attention_mask,
            pixel_values=x.images[0].pixel_values.repeat(4, 1),
            image_grid_thw=x.images[0].image_grid_thw.repeat(4, 1),
        ).logits
    R = x.responses.shape[1]
    lp1d = torch.log_softmax(out[:, -R - 1 : -1].float(), -1).gather(-1, x.responses[..., None]).squeeze(-1)
    wrong = max(float((lp1d[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs))
    assert wrong > 10 * max(worst, 1e-6), (wrong, worst)


def test_shared_prompt_forward_equals_full_forward_in_value_and_gradient(tiny_processor, tiny_model_dir):
    """Running each prompt once (KV cache shared by its samples) gives the same log-probs and gradients as running
    every sample's full sequence, with images, two-image prompts, text-only prompts and uneven lengths."""
    torch.manual_seed(2)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [solid((0, 200, 0))], 0),
        make_prompt(tiny_processor, "Two pictures, longer question text here.", [noise(5), noise(6, (56, 112))], 1),
        make_prompt(tiny_processor, "Text only.", [], 2),
        # the same token ids as prompt 0 with another image: samples must not share prompt 0's KV
        make_prompt(tiny_processor, "What colour is the shape?", [solid((200, 0, 0))], 3),
    ]
    rb = HFRollout(model.eval(), tiny_processor).generate(prompts, SamplingSpec(n=3, max_tokens=9))
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    rows = [1, 0, 4, 3, 8, 6, 7, 9, 11]  # mixed order, a prompt split over positions, one sample of prompt 1 dropped
    x = x.select(rows)
    out = {}
    for name, fn in (("full", forward.full_sequence_logits), ("shared", forward.shared_sample_logits)):
        model.zero_grad()
        logits, extra = fn(model, x, ids)
        lp = forward.token_logprobs(logits, x.responses)
        (-(lp * x.response_mask).sum() + extra).backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        out[name] = (lp.detach() * x.response_mask, grads)
    assert torch.allclose(out["shared"][0], out["full"][0], atol=2e-5), (out["shared"][0] - out["full"][0]).abs().max()
    assert torch.allclose(out["shared"][1], out["full"][1], atol=1e-4, rtol=1e-3)
    lp, _, _ = response_logprobs(model.eval(), x, ids)  # what the policy calls: the shared forward outside training
    assert torch.equal(lp.detach() * x.response_mask, out["shared"][0])
    # and both equal the log-probs the sampler reported
    for k, r in enumerate(rows):
        ref = torch.tensor(rb.logprobs[r])
        assert (out["shared"][0][k, : len(ref)] - ref).abs().max() < 1e-5


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_logprobs_loss_and_gradients(tiny_processor, tiny_model_dir, lora):
    """``enable_gradient_checkpointing`` (every GPU recipe sets it) trains exactly like the plain forward: the same
    per-token log-probs, PPO + entropy loss and parameter gradients (fp32, <= 1e-5), on prompts with one image, two
    images and none. transformers keeps no KV cache under checkpointing, so the shared-prompt forward must step aside
    (it crashed at step 1 before: ``'NoneType' object has no attribute 'batch_select_indices'``)."""
    from vlmrl.algorithms.losses import LossConfig, agg_loss, get_policy_loss

    torch.manual_seed(3)
    models = {}
    for ckpt in (False, True):
        m = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
        if lora:  # verl's LoRA recipe sets both (a peft wrapper hides the forward's signature)
            from vlmrl.config import ModelConfig
            from vlmrl.workers.lora import apply_lora

            torch.manual_seed(5)
            m = apply_lora(m, ModelConfig(path="tiny", lora_rank=4, lora_alpha=8))
            for name, p in m.named_parameters():  # non-zero B: the adapters change the output and get gradients
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.02)
        if ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        models[ckpt] = m.train()
    prompts = [
        make_prompt(tiny_processor, "What colour is the shape?", [solid((0, 200, 0))], 0),
        make_prompt(tiny_processor, "Two pictures, longer question text here.", [noise(5), noise(6, (56, 112))], 1),
        make_prompt(tiny_processor, "Text only.", [], 2),
    ]
    rb = HFRollout(models[False].eval(), tiny_processor).generate(prompts, SamplingSpec(n=3, max_tokens=9))
    models[False].train()
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    adv = torch.linspace(-1.0, 1.0, x.batch_size)
    loss_fn = get_policy_loss("vanilla")
    out = {}
    for ckpt, model in models.items():
        assert forward.checkpointing_in_training(model) is ckpt
        lp, ent, extra = response_logprobs(model, x, ids, with_entropy=True)
        mask = x.response_mask
        old = lp.detach() - 0.05 * mask  # ratios off 1, so the clipped branch is exercised too
        pg, _ = loss_fn(old, lp, adv[:, None].expand_as(lp), mask, "token-mean", LossConfig())
        loss = pg - 0.01 * agg_loss(ent, mask, "token-mean")
        (loss + extra).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        out[ckpt] = ((lp.detach() * mask), float(loss), grads)
    assert (out[True][0] - out[False][0]).abs().max() <= 1e-5
    assert abs(out[True][1] - out[False][1]) <= 1e-5
    assert out[True][2].keys() == out[False][2].keys() and len(out[True][2]) >= 4
    worst = max(float((out[True][2][k] - out[False][2][k]).abs().max()) for k in out[False][2])
    assert worst <= 1e-5, worst
    assert any(float(g.abs().max()) > 1e-4 for g in out[False][2].values()), "gradients must not be trivially zero"
