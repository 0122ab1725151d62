"""Every model family through the same checks (``models.families``): the tiny model of each family is its real
architecture and processor; the engine (vLLM on CPU) and the HF rollout give the trainer's log-probs on image,
two-image, video, image+video and text prompts (padded, shared-prompt and packed forwards), the engine expands the
prompts as the processor does (Qwen3-VL's video timestamps included), a weight push equals the pushed weights; LoRA,
gradient checkpointing, packing and token-budget micro-batches give the same log-probs and gradients.

Qwen2.5-VL's own tests (test_models, test_rollout, test_video, test_packing, ...) stay as they were. The tiny
Qwen3-VL-MoE (4 experts, 2 per token) runs on vLLM's CPU MoE kernel, so it takes every check too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor
from utils import clip, expanded, noise, solid, video_prompt

from vlmrl.batch import PromptSample, RolloutBatch
from vlmrl.models import forward, packing, qwen_vl
from vlmrl.models.families import FAMILIES, family_of_processor
from vlmrl.models.inputs import VIDEO_AS_GIVEN, ModelInputs, build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout
from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

FAMILY_NAMES = [
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "glm4v",
    "internvl",
    "smolvlm",
    "idefics3",
    "llava_onevision",
    "gemma3",
]
"""The tiny models (``FAMILY_SPECS``): Qwen2-VL is a model type of the Qwen2.5-VL family and Idefics3 one of the
SmolVLM family, checked all the same."""


@dataclass
class Tiny:
    """A family's tiny model, processor and family record."""

    name: str
    path: str
    processor: Any
    family: qwen_vl.Family

    def model(self, **kw: Any) -> torch.nn.Module:
        """A fresh fp32 copy with vlmrl's varlen attention (what the workers load)."""
        return AutoModelForImageTextToText.from_pretrained(
            self.path, dtype=torch.float32, attn_implementation=packing.VARLEN, **kw
        )

    def engine(self) -> Any:
        """A vLLM (CPU) engine of the tiny model for two images (and a video where the family has them) a prompt,
        with the processor's pixel bounds (a tiled family's processor bounds its own tiles)."""
        from vlmrl.config import RolloutConfig
        from vlmrl.rollout.vllm import VLLMRollout

        tiled, proc = self.family.tiles, self.processor
        return VLLMRollout(
            self.path,
            rollout_cfg=RolloutConfig(),
            max_model_len=512,
            limit_images=2,
            limit_videos=int(self.family.videos),
            pixel_bounds=None if tiled else qwen_vl.pixel_bounds(proc.image_processor),
            video_pixel_bounds=None if tiled else qwen_vl.pixel_bounds(proc.video_processor),
        )


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def tiny(request) -> Tiny:
    path = str(ensure_tiny_model(0, FAMILY_SPECS[request.param]))
    proc = AutoProcessor.from_pretrained(path)
    return Tiny(request.param, path, proc, qwen_vl.family_of(AutoConfig.from_pretrained(path)))


def prompts_of(proc: Any) -> list[PromptSample]:
    """Image, two-image (one tall), video, image + video (odd frame count) and text-only prompts; for a family vlmrl
    trains without videos (``Family.videos``) the video prompts hold a third image instead, so every family runs
    five prompts of the same positions in the list."""
    videos = family_of_processor(proc).videos
    return [
        video_prompt(proc, "Two pictures.", [], 2.0, images=[noise(1), noise(2, (56, 112))], index=0),
        video_prompt(proc, "What happens?", [clip(6)], fps=1.5, index=1)
        if videos
        else video_prompt(proc, "What happens?", [], 2.0, images=[noise(4, (84, 56))], index=1),
        video_prompt(proc, "Picture and clip.", [clip(5, (56, 56), 30)], 3.0, images=[noise(3)], index=2)
        if videos
        else video_prompt(proc, "Picture and text.", [], 3.0, images=[noise(3)], index=2),
        video_prompt(proc, "What colour is the shape?", [], 2.0, images=[solid((0, 200, 0))], index=3),
        video_prompt(proc, "Just text.", [], 2.0, index=4),
    ]


def processor_ids(proc: Any, p: PromptSample) -> list[int]:
    """The processor's own expansion of a prompt (its images, its videos with vlmrl's metadata)."""
    meta = [
        {k: x for k, x in qwen_vl.video_metadata(len(v.frames), v.sample_fps).items() if k != "do_sample_frames"}
        for v in p.videos
    ]
    enc = proc(
        text=[p.prompt_text],
        images=p.images or None,
        videos=[v.frames for v in p.videos] or None,
        videos_kwargs={"video_metadata": meta, **VIDEO_AS_GIVEN} if p.videos else {},
        return_tensors="pt",
    )
    return enc["input_ids"][0].tolist()


def inputs(tiny: Tiny, prompts: list[PromptSample], rb: RolloutBatch) -> ModelInputs:
    return build_inputs(prompts, rb, process_images(tiny.processor, prompts), tiny.processor.tokenizer.pad_token_id)


def gap(lp: torch.Tensor, rb: RolloutBatch) -> float:
    """Largest |trainer - sampler| log-prob over the sampled tokens."""
    return max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs) if r)


def trainer_gaps(model: torch.nn.Module, tiny: Tiny, prompts: list[PromptSample], rb: RolloutBatch) -> dict:
    """The sampler-vs-trainer gap of each forward the trainer has."""
    ids = qwen_vl.vision_token_ids(tiny.processor.tokenizer)
    x = inputs(tiny, prompts, rb)
    out = {}
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits, forward.packed_logits):
        with torch.no_grad():
            logits, extra = fn(model, x, ids)
        assert float(extra) == 0.0
        out[fn.__name__] = gap(forward.token_logprobs(logits, x.responses), rb)
    return out


def test_the_tiny_model_of_each_family_is_its_real_architecture(tiny: Tiny, tmp_path) -> None:
    """The builder's CLI writes the family's real model and processor; vlmrl reads the family off the checkpoint."""
    from vlmrl.testing.tiny import main

    main(["--output", str(tmp_path / "m"), "--family", tiny.name])
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "m")
    proc = AutoProcessor.from_pretrained(tmp_path / "m")
    assert qwen_vl.check_model_type(model.config, "test") is tiny.family
    vision = model.config.vision_config
    if tiny.name in ("smolvlm", "idefics3"):  # 56-px tiles of 14-px patches in a grid, 4 tokens each; Llama, 1-D RoPE
        cls = "SmolVLM" if tiny.name == "smolvlm" else "Idefics3"
        assert (type(model).__name__, type(proc).__name__) == (f"{cls}ForConditionalGeneration", f"{cls}Processor")
        tile = proc.image_processor.max_image_size["longest_edge"]
        assert (vision.patch_size, vision.image_size, tile) == (14, 56, 56)
        assert proc.image_seq_len == 4 and model.config.text_config.model_type == "llama" and not tiny.family.mrope
        text = proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert text == "<|im_start|>User:<image>hi<end_of_utterance>\nAssistant:"  # SmolVLM's template
        # Idefics3's tokenizers have no video token: its id is one no token has
        assert (qwen_vl.vision_token_ids(proc.tokenizer).video_pad < 0) is (tiny.name == "idefics3")
        assert model.generation_config.eos_token_id[0] == proc.tokenizer.convert_tokens_to_ids("<end_of_utterance>")
        sizes = [len(qwen_vl.vision_modules(model)), len(qwen_vl.vision_blocks(model))]
        assert sizes == [2, FAMILY_SPECS["smolvlm"].vision_depth]
    elif tiny.name == "llava_onevision":  # a 56-px base view + anyres patches of 16 tokens; Qwen2, 1-D RoPE
        cls = "LlavaOnevision"
        assert (type(model).__name__, type(proc).__name__) == (f"{cls}ForConditionalGeneration", f"{cls}Processor")
        assert (vision.patch_size, vision.image_size, proc.num_image_tokens) == (14, 56, 16)
        assert model.config.text_config.model_type == "qwen2" and not tiny.family.mrope
        text = proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert text == "<|im_start|>user <image>\nhi<|im_end|>\n<|im_start|>assistant\n"  # LLaVA-OneVision's
        # the hub's names: transformers 5.19 writes the SigLIP tower without its vision_model level, vLLM reads it
        from safetensors import safe_open

        with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
            tower = [k for k in f.keys() if k.startswith("vision_tower.")]
        assert tower and all(k.startswith("vision_tower.vision_model.") for k in tower)
        sizes = [len(qwen_vl.vision_modules(model)), len(qwen_vl.vision_blocks(model))]
        assert sizes == [2, FAMILY_SPECS["llava_onevision"].vision_depth]
    elif tiny.name == "gemma3":  # one 56-px image of 14-px patches pooled to 4 tokens; Gemma 3's decoder, 1-D RoPE
        assert (type(model).__name__, type(proc).__name__) == ("Gemma3ForConditionalGeneration", "Gemma3Processor")
        assert (vision.patch_size, vision.image_size, proc.image_seq_length, model.config.mm_tokens_per_image) == (
            14,
            56,
            4,
            4,
        )
        text_cfg = model.config.text_config
        assert text_cfg.layer_types == ["sliding_attention", "full_attention"] and text_cfg.sliding_window == 24
        assert not tiny.family.mrope and tiny.family.bidirectional_images and not proc.image_processor.do_pan_and_scan
        text = proc.apply_chat_template(
            [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )  # Gemma 3's template: the system text opens the first user turn
        assert text == "<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>hi<end_of_turn>\n<start_of_turn>model\n"
        tok = proc.tokenizer  # newline runs are single tokens, as in Gemma's vocabulary
        assert [len(tok("\n" * k, add_special_tokens=False)["input_ids"]) for k in (1, 2, 3, 4)] == [1, 1, 1, 1]
        ids = qwen_vl.vision_token_ids(tok)
        assert tok.convert_ids_to_tokens([ids.image_pad, ids.vision_end, *ids.extra]) == [
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ]
        ends = {tok.convert_tokens_to_ids(t) for t in ("<end_of_turn>", "<eos>")}
        assert set(model.generation_config.eos_token_id) == ends
        from safetensors import safe_open

        with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
            tower = [k for k in f.keys() if k.startswith("vision_tower.")]
        assert tower and all(k.startswith("vision_tower.vision_model.") for k in tower)  # the hub's names
        sizes = [len(qwen_vl.vision_modules(model)), len(qwen_vl.vision_blocks(model))]
        assert sizes == [2, FAMILY_SPECS["gemma3"].vision_depth]
    elif tiny.family.tiles:  # InternVL: 56-px tiles of 14-px patches, 4 tokens each; a Qwen2 decoder, 1-D RoPE
        assert type(model).__name__ == "InternVLForConditionalGeneration" and type(proc).__name__ == "InternVLProcessor"
        assert list(vision.patch_size) == [tiny.family.patch_size] * 2 and list(vision.image_size) == [56, 56]
        assert proc.image_seq_length == model.config.image_seq_length == 4
        assert model.config.text_config.model_type == "qwen2" and not tiny.family.mrope
        text = proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert text == "<|im_start|>user\n<IMG_CONTEXT>\nhi<|im_end|>\n<|im_start|>assistant\n"
        ids = qwen_vl.vision_token_ids(proc.tokenizer)  # its own tokens, not the Qwen ones it also holds
        assert proc.tokenizer.convert_ids_to_tokens([ids.image_pad, ids.vision_start]) == ["<IMG_CONTEXT>", "<img>"]
        sizes = [len(qwen_vl.vision_modules(model)), len(qwen_vl.vision_blocks(model))]
        assert sizes == [2, FAMILY_SPECS["internvl"].vision_depth]
    else:
        assert proc.image_processor.patch_size == tiny.family.patch_size
        assert qwen_vl.patch_factor(proc.image_processor) == 2 * tiny.family.patch_size
        assert bool(getattr(vision, "deepstack_visual_indexes", None)) is tiny.family.deepstack
        assert qwen_vl.vision_levels(model) == 1 + len(getattr(vision, "deepstack_visual_indexes", None) or ())
    assert model.config.model_type == tiny.name
    if tiny.name == "qwen2_vl":
        assert type(model).__name__ == "Qwen2VLForConditionalGeneration" and type(proc).__name__ == "Qwen2VLProcessor"
        assert getattr(model.config.vision_config, "tokens_per_second", None) is None  # frame-pair temporal positions
    if tiny.family.video_timestamps:
        moe = tiny.name == "qwen3_vl_moe"
        assert type(model).__name__ == (
            "Qwen3VLMoeForConditionalGeneration" if moe else "Qwen3VLForConditionalGeneration"
        )
        assert tiny.family.moe is moe and bool(tiny.family.fused_experts) is moe
        if moe:  # README: 4 experts, 2 per token
            assert (model.config.text_config.num_experts, model.config.text_config.num_experts_per_tok) == (4, 2)
        assert model.config.text_config.rope_parameters["mrope_interleaved"] is True
        assert type(proc).__name__ == "Qwen3VLProcessor"
        text = proc.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # Qwen3-VL: no default system
    if tiny.name == "glm4v":
        assert type(model).__name__ == "Glm4vForConditionalGeneration" and type(proc).__name__ == "Glm4vProcessor"
        assert model.config.text_config.rope_parameters["partial_rotary_factor"] == 0.5
        text = proc.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
        assert text == "[gMASK]<sop><|user|>\nhi<|assistant|>\n"  # GLM's template
        ends = {proc.tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")}
        assert set(model.generation_config.eos_token_id) == ends
        # the processor's size counts an image as two frames: vlmrl's bounds are one image's area
        assert qwen_vl.pixel_bounds(proc.image_processor) == (FAMILY_SPECS["glm4v"].min_pixels, 28 * 28 * 16)
        assert proc.image_processor.size["longest_edge"] == 2 * 28 * 28 * 16
    base = AutoProcessor.from_pretrained(ensure_tiny_model(0)).tokenizer  # the tiny Qwen2.5-VL's
    if tiny.family.vision_tokens == FAMILIES["qwen2_5_vl"].vision_tokens:  # README: one tokenizer in the Qwen families
        assert proc.tokenizer.get_vocab() == base.get_vocab()
    else:  # the same trained vocabulary with the family's own special tokens
        common = set(base.get_vocab()) & set(proc.tokenizer.get_vocab())
        assert len(common) >= len(base.get_vocab()) - 20
    with pytest.raises(ValueError, match="not supported.*Qwen3-VL"):
        qwen_vl.check_model_type(type("C", (), {"model_type": "llava"})(), "actor_rollout_ref.model.path=x")
    with pytest.raises(ValueError, match=r"'glm4v_moe' is not supported \(the closest: GLM-4.1V, 'glm4v', a diff"):
        qwen_vl.check_model_type(type("C", (), {"model_type": "glm4v_moe"})(), "actor_rollout_ref.model.path=x")
    with pytest.raises(ValueError, match=r"'internvl_chat' is not supported \(the closest: InternVL, 'internvl', a di"):
        qwen_vl.check_model_type(type("C", (), {"model_type": "internvl_chat"})(), "actor_rollout_ref.model.path=x")


def test_prompt_expansion_equals_the_processors(tiny: Tiny) -> None:
    """One pad per image and video expands as the processor expands it: Qwen3-VL's videos become a timestamp and
    their own vision start / end per temporal patch (``<0.2 seconds>`` for frames 0 and 1 at 3 fps)."""
    for p in prompts_of(tiny.processor):
        assert expanded(tiny.processor, p) == processor_ids(tiny.processor, p), p.prompt_text
    p = prompts_of(tiny.processor)[2]
    text = tiny.processor.tokenizer.decode(expanded(tiny.processor, p))
    stamps = "<0.2 seconds>" in text and "<0.8 seconds>" in text and "<1.5 seconds>" in text
    assert stamps is tiny.family.video_timestamps, text
    assert bool(p.videos) is tiny.family.videos


@pytest.mark.vllm
def test_engine_hf_rollout_and_trainer_agree_and_a_push_equals_fresh_weights(tiny: Tiny) -> None:
    """vLLM's samples on every prompt kind: its expanded prompt ids are the processor's, and its log-probs equal the
    trainer's shared-prompt, full-sequence and packed forwards (<= 1e-4); the HF rollout's too. Then pushes (language
    model, then vision tower only) make the running engine sample what the pushed weights give (greedy equal to HF
    generate, log-probs equal to their forward): no stale weight, prefix cache or vision feature survives."""
    from vlmrl.workers.weights import engine_weights

    proc = tiny.processor
    model = tiny.model().eval()
    if tiny.family.bidirectional_images:  # Gemma 3: vLLM's CPU attention would attend causally over its images
        with pytest.raises(ValueError, match="attend to each other both ways.*rollout.name=hf"):
            tiny.engine()
        hf_rollout_equals_the_trainer(model, tiny, prompts_of(proc))
        return
    engine = tiny.engine()
    try:
        prompts = prompts_of(proc)
        rb = engine.generate(prompts, SamplingSpec(n=3, max_tokens=10, temperature=1.0))
        assert len({tuple(r) for r in rb.response_ids}) > 5
        for k, p in enumerate(prompts):
            assert rb.prompt_ids[3 * k] == processor_ids(proc, p) == expanded(proc, p)
        gaps = trainer_gaps(model, tiny, prompts, rb)
        print(f"{tiny.name} vLLM vs trainer: {gaps}")
        assert max(gaps.values()) <= 1e-4, gaps

        hf_rollout_equals_the_trainer(model, tiny, prompts)

        greedy = SamplingSpec(n=1, max_tokens=8, temperature=0.0)
        probe = [prompts[2], prompts[3]]
        before = engine.generate(probe, greedy)
        original = tiny.model()
        pushed = []
        g = torch.Generator().manual_seed(7)
        try:
            tower = tuple(f"model.{m}." for m in tiny.family.vision_modules)
            for part, scale in ((lambda n: not n.startswith(tower), 0.5), (lambda n: n.startswith(tower), 2.0)):
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        if part(n):
                            spread = float(p.std()) if p.numel() > 1 else 0.0  # zero-initialised biases too
                            p.add_(torch.randn(p.shape, generator=g) * scale * (spread or 0.1))
                sent = engine.update_weights(engine_weights(model))  # the trainer's push
                assert sent > 0
                got = engine.generate(probe, greedy)
                assert got.response_ids == HFRollout(model, proc).generate(probe, greedy).response_ids
                sampled = engine.generate(probe, SamplingSpec(n=3, max_tokens=10))
                assert max(trainer_gaps(model, tiny, probe, sampled).values()) <= 1e-4
                pushed.append(got.logprobs)
        finally:
            engine.update_weights(engine_weights(original))
        assert pushed[0] != before.logprobs and pushed[1] != pushed[0], "a push changed nothing"
        # vLLM's own reload (the CPU push's fallback): the perturbed weights again, then the original ones
        engine.direct_push_unsupported = "test: vLLM's reload_weights"
        for weights in (model, original):
            engine.update_weights(engine_weights(weights))
            again = engine.generate(probe, SamplingSpec(n=3, max_tokens=10))
            assert max(trainer_gaps(weights.eval(), tiny, probe, again).values()) <= 1e-4
    finally:
        engine.close()


def hf_rollout_equals_the_trainer(model: torch.nn.Module, tiny: Tiny, prompts: list[PromptSample]) -> None:
    """The HF rollout's log-probs equal the trainer's shared-prompt, full-sequence and packed forwards (<= 1e-4)."""
    torch.manual_seed(0)
    hf_rb = HFRollout(model, tiny.processor).generate(prompts, SamplingSpec(n=2, max_tokens=8))
    assert len({tuple(r) for r in hf_rb.response_ids}) > 4
    hf_gaps = trainer_gaps(model, tiny, prompts, hf_rb)
    print(f"{tiny.name} HF rollout vs trainer: {hf_gaps}")
    assert max(hf_gaps.values()) <= 1e-4, hf_gaps


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointing_lora_packing_and_token_budgets_give_the_same_gradients(tiny: Tiny, lora: bool) -> None:
    """The trainer's forwards on every prompt kind give the same log-probs and PPO-loss gradients (fp32, <= 1e-5):
    shared-prompt (plain), full-sequence (gradient checkpointing), packed (both), and the batch split into
    token-budget micro-batches with their losses summed; with LoRA adapters too."""
    from vlmrl.algorithms.losses import LossConfig, get_policy_loss
    from vlmrl.workers.policy import token_micro_batches

    proc = tiny.processor
    prompts = prompts_of(proc)
    torch.manual_seed(3)
    rb = HFRollout(tiny.model().eval(), proc).generate(prompts, SamplingSpec(n=2, max_tokens=7))
    x = inputs(tiny, prompts, rb)
    ids = qwen_vl.vision_token_ids(proc.tokenizer)
    adv = torch.linspace(-1.0, 1.0, x.batch_size)
    loss_fn = get_policy_loss("vanilla")

    def make(ckpt: bool) -> torch.nn.Module:
        m = tiny.model()
        if lora:
            from vlmrl.config import ModelConfig
            from vlmrl.workers.lora import apply_lora

            torch.manual_seed(5)
            m = apply_lora(m, ModelConfig(path="tiny", lora_rank=4, lora_alpha=8))
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    torch.nn.init.normal_(p, std=0.02)
        if ckpt:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m.train()

    def loss_and_grads(model: torch.nn.Module, packed: bool, batches: list[list[int]]) -> tuple:
        model.zero_grad()
        lps = torch.zeros_like(x.response_mask, dtype=torch.float32)
        total = x.response_mask.sum()
        for rows in batches:
            mb = x.select(rows)
            lp, _, extra = forward.response_logprobs(model, mb, ids, packed=packed)
            old = lp.detach() - 0.05 * mb.response_mask
            pg, _ = loss_fn(old, lp, adv[rows][:, None].expand_as(lp), mb.response_mask, "token-sum", LossConfig())
            (pg / total + extra).backward()
            lps[rows, : lp.shape[1]] = lp.detach() * mb.response_mask
        return lps, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    everything = [list(range(x.batch_size))]
    ref_lp, ref_g = loss_and_grads(make(False), False, everything)
    assert any(float(g.abs().max()) > 1e-4 for g in ref_g.values())
    longest = int(x.attention_mask.sum(1).max())  # (SmolVLM's grid tokens make its image prompts longer)
    limit = max(160 if tiny.family.videos else 60, longest)  # (image-only prompts are shorter)
    budget = token_micro_batches(x, everything[0], limit, "ppo_max_token_len_per_gpu", "cpu", 1, packed=True)
    assert len(budget) > 2
    for ckpt, packed, batches in (
        (True, False, everything),
        (False, True, everything),
        (True, True, everything),
        (False, True, budget),
    ):
        lp, grads = loss_and_grads(make(ckpt), packed, batches)
        what = f"checkpointing={ckpt} packed={packed} micro-batches={len(batches)}"
        assert float((lp - ref_lp).abs().max()) <= 1e-5, what
        assert grads.keys() == ref_g.keys(), what
        worst = max(float((grads[k] - ref_g[k]).abs().max()) for k in ref_g)
        assert worst <= 1e-5, (what, worst)


def test_gemma3s_image_tokens_attend_both_ways_in_every_forward() -> None:
    """Gemma 3's image tokens see their whole image, and its sliding-window layer 24 tokens back: the trainer's
    shared-prompt, full-sequence and packed forwards give the log-probs of the model fed as its processor feeds it
    (``token_type_ids`` from ``Gemma3Processor``), on a two-image prompt longer than the window, and a causal reading
    of the same ids differs (so the check can fail)."""
    path = str(ensure_tiny_model(0, FAMILY_SPECS["gemma3"]))
    proc = AutoProcessor.from_pretrained(path)
    tiny = Tiny("gemma3", path, proc, FAMILIES["gemma3"])
    model = tiny.model().eval()
    prompt = prompts_of(proc)[0]  # two images
    response = [11, 12, 13, 14, 15, 16]
    rb = RolloutBatch([expanded(proc, prompt)], [response], [[0.0] * len(response)], ["length"], n=1)
    enc = proc(text=[prompt.prompt_text], images=[prompt.images], return_tensors="pt")
    assert enc["input_ids"][0].tolist() == rb.prompt_ids[0] and int(enc["token_type_ids"].sum()) == 8
    ids = torch.cat([enc["input_ids"], torch.tensor([response])], dim=1)
    assert ids.shape[1] > model.config.text_config.sliding_window  # the window acts
    types = torch.cat([enc["token_type_ids"], torch.zeros(1, len(response), dtype=torch.long)], dim=1)

    def reference(**kw: Any) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=enc["pixel_values"], **kw).logits
        P = enc["input_ids"].shape[1]
        return forward.token_logprobs(logits[:, P - 1 : -1], torch.tensor([response]))

    want, causal = reference(token_type_ids=types), reference()
    assert float((want - causal).abs().max()) > 1e-3  # the images' two-way attention shows in the response
    x = inputs(tiny, [prompt], rb)
    vision_ids = qwen_vl.vision_token_ids(proc.tokenizer)
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits, forward.packed_logits):
        with torch.no_grad():
            logits, _ = fn(model, x, vision_ids)
        got = forward.token_logprobs(logits, x.responses)
        assert float((got - want).abs().max()) <= 1e-5, fn.__name__


def test_a_text_only_micro_batch_runs_the_dummy_vision_pass(tiny: Tiny) -> None:
    """A micro-batch without images runs the family's vision modules on a dummy input (a tiled family's: a constant
    tile through the tower and the projector), so every vision parameter that a micro-batch with an image trains
    gets a gradient, all zero, and the loss is the text's alone (an FSDP rank without images joins the same
    collectives). (LLaVA-OneVision's SigLIP tower has a final norm and pooling head its features never use.)"""
    ids = qwen_vl.vision_token_ids(tiny.processor.tokenizer)

    def vision_grads(prompt: PromptSample) -> tuple[dict, torch.Tensor]:
        rb = RolloutBatch([expanded(tiny.processor, prompt)], [[10, 11, 12]], [[0.0] * 3], ["length"], n=1)
        model = tiny.model()
        lp, _, extra = forward.response_logprobs(model, inputs(tiny, [prompt], rb), ids)
        (-(lp.sum()) + extra).backward()
        named = [
            (f"{i}.{n}", q.grad) for i, m in enumerate(qwen_vl.vision_modules(model)) for n, q in m.named_parameters()
        ]
        return {n: g for n, g in named if g is not None}, extra

    with_image = prompts_of(tiny.processor)[3]  # one image
    used, _ = vision_grads(with_image)
    text_only, extra = vision_grads(prompts_of(tiny.processor)[4])
    assert float(extra) == 0.0 and used and text_only.keys() == used.keys()
    assert all(float(g.abs().sum()) == 0.0 for g in text_only.values())


def test_moe_checkpoints_are_written_in_the_hubs_layout(tmp_path) -> None:
    """transformers 5.19 would save Qwen3-VL-MoE's fused expert weights as it holds them ([E, 2I, H] / [E, H, I]),
    which vLLM reads as the hub's [E, H, 2I] / [E, I, H] and transposes again: ``qwen_vl.save_pretrained`` (the tiny
    builder's and ``vlmrl.export``'s) writes the hub's layout, which transformers loads back to the same weights, and
    the weight push sends that layout too."""
    from safetensors import safe_open

    from vlmrl.workers.weights import engine_weights

    path = ensure_tiny_model(0, FAMILY_SPECS["qwen3_vl_moe"])
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    held = dict(model.named_parameters())
    qwen_vl.save_pretrained(model, tmp_path / "out")
    for folder in (path, tmp_path / "out"):  # the tiny builder's checkpoint and a save of it
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            names = [n for n in f.keys() if n.endswith(FAMILIES["qwen3_vl_moe"].fused_experts)]  # noqa: SIM118
            assert len(names) == 2 * model.config.text_config.num_hidden_layers, names
            for name in names:
                assert f.get_slice(name).get_shape() == list(held[name].transpose(-1, -2).shape), name
    again = AutoModelForImageTextToText.from_pretrained(tmp_path / "out", dtype=torch.float32)
    for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), n
    pushed = dict(engine_weights(model))
    experts = [n for n in pushed if n.endswith(FAMILIES["qwen3_vl_moe"].fused_experts)]
    assert len(experts) == 2 * model.config.text_config.num_hidden_layers
    assert all(pushed[n].shape == held[n].transpose(-1, -2).shape for n in experts)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_the_dataset_counts_a_video_prompt_as_the_engine_expands_it(name: str, tmp_path) -> None:
    """A video prompt's length as the dataset counts it (``max_prompt_length``, the overlong filter) is the length
    of the ids the trainer and the engine run: Qwen3-VL's timestamps and per-patch vision start / end included."""
    from utils import synthetic_data

    from vlmrl.config import DataConfig
    from vlmrl.data import RLDataset

    path = str(ensure_tiny_model(0, FAMILY_SPECS[name]))
    proc = AutoProcessor.from_pretrained(path)
    data = synthetic_data(tmp_path, "video_colour", train=6, test=2, size=112)
    files = str(data / "train.parquet")
    ds = RLDataset(files, proc, DataConfig(train_files=files, max_prompt_length=512), verbose=False)
    for i in range(len(ds)):
        p = ds[i]
        assert p.videos and ds.prompt_lengths[i] == len(expanded(proc, p)), (i, name)


TILES = {"internvl": [3, 5, 4, 1], "smolvlm": [3, 3, 3, 5], "idefics3": [3, 3, 3, 5]}
"""Tiles of a wide, a tall, a very wide and a small square image (112 x 56, 40 x 200, 300 x 90, 56 x 56). InternVL:
2 + thumbnail, 4 (at most) + thumbnail, 3 + thumbnail, 1 (no thumbnail). SmolVLM scales the longest edge to 112 px
and cuts 56-px tiles: 1 x 2 + global, 2 x 1 + global, 1 x 2 + global, 2 x 2 + global (Idefics3's processor too)."""


PADS = {"llava_onevision": [52, 52, 68, 36]}
"""LLaVA-OneVision's pads of the same images: its base view's 16 tokens, then the anyres patches' features unpadded
to the image's aspect ratio with a newline after each row (112 x 56: 16 + 4 x 8 + 4; 56 x 56: 16 + 4 x 4 + 4)."""


@pytest.mark.parametrize("name", [*TILES, *PADS])
def test_the_dataset_hands_a_tiled_familys_images_on_as_they_are_and_counts_their_tiles(name: str, tmp_path) -> None:
    """InternVL and SmolVLM (``Family.tiles``): the dataset does not resize their images (the processor tiles them
    by the aspect ratio, plus a thumbnail or global view), and a prompt's length as it counts it
    (``max_prompt_length``, the overlong filter) is the length of the ids the trainer and the engine run (InternVL:
    the vision start, 4 tokens a tile, the vision end; SmolVLM: its grid's row / column tokens and newlines too).
    Records too long for the limit are filtered and counted, not cut."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from utils import synthetic_data

    from vlmrl.config import DataConfig
    from vlmrl.data import RLDataset

    path = str(ensure_tiny_model(0, FAMILY_SPECS[name]))
    proc = AutoProcessor.from_pretrained(path)
    data = synthetic_data(tmp_path, "colour", train=4, test=2, size=112)
    files = str(data / "train.parquet")
    table = pq.read_table(files)
    sizes = [(112, 56), (40, 200), (300, 90), (56, 56)]  # wide, tall, very wide, one tile
    images = []
    for k, size in enumerate(sizes):
        buf = io.BytesIO()
        noise(k, size).save(buf, format="PNG")
        images.append([{"bytes": buf.getvalue(), "path": None}])
    column = table.schema.get_field_index("images")
    pq.write_table(table.set_column(column, "images", pa.array(images, type=table.schema.field("images").type)), files)
    ds = RLDataset(files, proc, DataConfig(train_files=files, max_prompt_length=512), verbose=False)
    lengths = []
    for i in range(len(ds)):
        p = ds[i]
        assert p.images[0].size == sizes[i]  # as it was
        ids = expanded(proc, p)
        assert ds.prompt_lengths[i] == len(ids) == len(processor_ids(proc, p)), i
        lengths.append(len(ids))
    ids = qwen_vl.vision_token_ids(proc.tokenizer)
    pads = [sum(1 for t in expanded(proc, ds[i]) if t == ids.image_pad) for i in range(len(ds))]
    assert pads == PADS.get(name, [4 * t for t in TILES.get(name, [])]), pads
    short = RLDataset(files, proc, DataConfig(train_files=files, max_prompt_length=max(lengths) - 1), verbose=False)
    assert len(short) == sum(n <= max(lengths) - 1 for n in lengths) and short.report["filtered"] > 0


def test_the_tokenizers_processor_class_names_its_familys_vision_tokens() -> None:
    """InternVL's tokenizer (Qwen2.5's with InternVL's tokens added) holds both families' vision tokens: its config's
    ``processor_class`` decides whose they are; without one, the family whose tokens say the most (then a tiled
    one) is taken."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model(0, FAMILY_SPECS["internvl"]))
    as_ids = lambda ids: tok.convert_ids_to_tokens([ids.image_pad, ids.vision_start])  # noqa: E731
    assert qwen_vl.tokenizer_processor_class(tok) == "InternVLProcessor"
    assert as_ids(qwen_vl.vision_token_ids(tok)) == ["<IMG_CONTEXT>", "<img>"]
    tok.init_kwargs["processor_class"] = "Qwen2_5_VLProcessor"
    assert as_ids(qwen_vl.vision_token_ids(tok)) == ["<|image_pad|>", "<|vision_start|>"]
    del tok.init_kwargs["processor_class"]
    assert as_ids(qwen_vl.vision_token_ids(tok)) == ["<IMG_CONTEXT>", "<img>"]
    tok.init_kwargs["processor_class"] = "SmolVLMProcessor"  # a class whose family's tokens it lacks: by tokens
    assert as_ids(qwen_vl.vision_token_ids(tok)) == ["<IMG_CONTEXT>", "<img>"]


def test_verls_image_patch_size_key_takes_each_familys_patch_size() -> None:
    """verl's ``data.image_patch_size`` (14 for Qwen2.5-VL, 16 for Qwen3-VL) is accepted with either (vlmrl reads the
    patch size from the model's processor); another value is refused naming the key."""
    from vlmrl.config import load
    from vlmrl.config.errors import ConfigError

    base = ["data.train_files=x", "actor_rollout_ref.model.path=m"]
    for size in (14, 16):
        load([*base, f"data.image_patch_size={size}"])
    with pytest.raises(ConfigError, match="data.image_patch_size=15"):
        load([*base, "data.image_patch_size=15"])


def test_what_a_family_is_not_trained_on_is_refused_by_name(tmp_path, capsys) -> None:
    """GLM-4.1V, InternVL, SmolVLM, LLaVA-OneVision and Gemma 3 (``Family.videos`` / ``tool_turns`` false): multi-turn
    tool rollouts and video limits are refused at the config gate naming the family (Gemma 3 on CPU also with the
    vLLM rollout, whose CPU attention cannot attend both ways inside an image); a record with a video is refused by
    the dataset naming the file and row; pixel bounds are refused for a tiled family; the dry run names each tiled
    family's layout; a
    GLM-4.1V config without ``text_config.attention_bias`` (vLLM would build the decoder without the q/k/v biases
    transformers has, and drop them from every push) is refused at the gate and at load. The Qwen model passes."""
    import json
    import shutil

    from utils import synthetic_data

    from vlmrl.config import DataConfig, load
    from vlmrl.config.checks import check_environment
    from vlmrl.data import RLDataset
    from vlmrl.data.dataset import DataError

    glm = ensure_tiny_model(0, FAMILY_SPECS["glm4v"])
    data = synthetic_data(tmp_path, "video_colour", train=4, test=2, size=112)
    files = str(data / "train.parquet")
    base = [f"data.train_files={files}", f"data.val_files={data / 'test.parquet'}"]
    mt = "actor_rollout_ref.rollout.multi_turn"
    zoom = Path(__file__).resolve().parents[1] / "examples" / "tool_config" / "zoom.yaml"
    turns = [f"{mt}.enable=True", f"{mt}.tool_config_path={zoom}"]
    internvl = ensure_tiny_model(0, FAMILY_SPECS["internvl"])
    smolvlm = ensure_tiny_model(0, FAMILY_SPECS["smolvlm"])
    llava = ensure_tiny_model(0, FAMILY_SPECS["llava_onevision"])
    qwen = ensure_tiny_model(0)
    for path, name, refused in (
        (glm, "GLM-4.1V (glm4v)", True),
        (internvl, "InternVL (internvl)", True),
        (smolvlm, "SmolVLM (smolvlm)", True),
        (llava, "LLaVA-OneVision (llava_onevision)", True),
        (qwen, "", 0),
    ):
        cfg = load([*base, f"actor_rollout_ref.model.path={path}", *turns, "actor_rollout_ref.rollout.limit_videos=1"])
        problems = [p for p in check_environment(cfg) if name and name in p]
        assert len(problems) == 2 * refused, problems
        assert not refused or "multi_turn.enable=True: vlmrl writes tool turns in Qwen's hermes format" in problems[0]
        assert not refused or f"limit_videos=1: vlmrl trains {name} on images and text" in problems[1]
    gemma = ensure_tiny_model(0, FAMILY_SPECS["gemma3"])  # also: its images attend both ways, which vLLM's CPU
    name = "Gemma 3 (gemma3)"  # attention does not do (the default rollout.name=vllm is refused on CPU)
    cfg = load([*base, f"actor_rollout_ref.model.path={gemma}", *turns, "actor_rollout_ref.rollout.limit_videos=1"])
    problems = [p for p in check_environment(cfg) if name in p]
    assert len(problems) == 3 and "actor_rollout_ref.rollout.name=vllm: Gemma 3 (gemma3)'s image tokens" in problems[2]
    assert problems[2].endswith("on CPU set actor_rollout_ref.rollout.name=hf."), problems[2]
    cfg = load([*base, f"actor_rollout_ref.model.path={gemma}", "actor_rollout_ref.rollout.name=hf"])
    assert not [p for p in check_environment(cfg) if name in p]
    from vlmrl import dry_run

    dry_run.run(cfg, [], [])
    plan = capsys.readouterr().out
    assert (
        "model family: Gemma 3 (one 56-px image of 4 tokens (no pan-and-scan), attending both ways inside each image, "
        "1-D positions, its own vision tokens <start_of_image>, " in plan
    )
    dry_run.run(load([*base, f"actor_rollout_ref.model.path={internvl}"]), [], [])  # (its videos: refused)
    plan = capsys.readouterr().out
    assert (
        "model family: InternVL (56-px tiles of 4 tokens, 1-D positions, its own vision tokens <IMG_CONTEXT>, " in plan
    )
    dry_run.run(load([*base, f"actor_rollout_ref.model.path={smolvlm}"]), [], [])
    plan = capsys.readouterr().out
    assert (
        "model family: SmolVLM (56-px tiles of 4 tokens in a grid of row/column tokens with a global view, 1-D "
        "positions, its own vision tokens <image>, " in plan
    )
    dry_run.run(load([*base, f"actor_rollout_ref.model.path={llava}"]), [], [])
    plan = capsys.readouterr().out
    assert (
        "model family: LLaVA-OneVision (a 56-px base view and anyres patches of 16 tokens with newline rows, 1-D "
        "positions, its own vision tokens <image>, " in plan
    )
    tiled = (
        (internvl, "InternVL (internvl)"),
        (smolvlm, "SmolVLM (smolvlm)"),
        (llava, "LLaVA-OneVision (llava_onevision)"),
        (gemma, "Gemma 3 (gemma3)"),
    )
    for path, label in tiled:  # tiles: no pixel bounds
        cfg = load(
            [
                *base,
                f"actor_rollout_ref.model.path={path}",
                "data.max_pixels=50176",
                "actor_rollout_ref.rollout.name=hf",
            ]
        )
        [problem] = [p for p in check_environment(cfg) if label in p]
        assert problem.startswith(f"data.max_pixels=50176: {label}'s processor cuts each image into tiles")
    families = ((glm, "GLM-4.1V"), (internvl, "InternVL"), (smolvlm, "SmolVLM"), (llava, "LLaVA-OneVision"))
    for path, label in (*families, (gemma, "Gemma 3")):
        proc = AutoProcessor.from_pretrained(path)
        with pytest.raises(
            DataError, match=rf"train.parquet.*row 0.*holds 1 video\(s\); vlmrl trains {label} on images"
        ):
            RLDataset(files, proc, DataConfig(train_files=files, max_prompt_length=512), verbose=False)

    plain = tmp_path / "no-bias"
    shutil.copytree(glm, plain)
    config = json.loads((plain / "config.json").read_text())
    del config["text_config"]["attention_bias"]
    (plain / "config.json").write_text(json.dumps(config))
    cfg = load([*base, f"actor_rollout_ref.model.path={plain}"])
    [problem] = [p for p in check_environment(cfg) if "attention_bias" in p]
    assert "its config has text_config.attention_bias=None; GLM-4.1V checkpoints have True there" in problem
    with pytest.raises(ValueError, match="text_config.attention_bias=None"):
        qwen_vl.check_model_type(AutoConfig.from_pretrained(plain), "actor_rollout_ref.model.path")
