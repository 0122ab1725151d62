"""Build a tiny random Qwen-VL fully offline: the real architecture, a locally trained tokenizer, the real processor.

    python -m vlmrl.testing.tiny --output DIR [--seed N] [--size tiny|20m|100m] [--family NAME]

Families (``models.families``): Qwen2.5-VL (the default), Qwen2-VL, Qwen3-VL (16-px patches, DeepStack, interleaved
M-RoPE, its chat template: no default system message), Qwen3-VL-MoE (Qwen3-VL with a mixture-of-experts language
model) and GLM-4.1V (GLM's special tokens, chat template and decoder; ``tiny_glm4v``).

The folder is a normal HF checkpoint: ``AutoProcessor`` + ``AutoModelForImageTextToText`` and ``vllm.LLM`` load it.
It is deterministic for a seed (same bytes of weights), a few MB, and built in seconds. Its untrained policy explores:
the output head starts small (std 0.02, near-uniform next-token distribution) and the vocabulary has no padded ids
that decode to nothing, so reinforcement learning from scratch finds rewarded answers.

Tests, examples and benchmarks share one cached copy per seed: ``ensure_tiny_model(seed)``. Larger shapes for
performance work (``SIZES``: ~20 M and ~100 M parameters, same tokenizer) are cached the same way:
``ensure_tiny_model(seed, SIZES["20m"])``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from vlmrl.testing import tiny_gemma3, tiny_glm4v, tiny_internvl, tiny_llava_onevision, tiny_smolvlm

# bump when the builder's output changes, so cached copies are rebuilt
BUILDER_VERSION = 1

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
"""Qwen2.5's tool-call tags: added tokens that are not special (``decode(skip_special_tokens=True)`` keeps them, so
the hermes parser reads them), ids right after the special tokens as in Qwen's vocabulary (151657, 151658)."""

# the chat template of Qwen/Qwen2.5-VL-*-Instruct (chat_template.json)
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# the chat template of Qwen/Qwen3-VL-*-Instruct for plain and vision content: Qwen2.5-VL's without its default system
# message (vlmrl writes the hermes tools block into the system message itself)
_DEFAULT_SYSTEM = (
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)
assert _DEFAULT_SYSTEM in CHAT_TEMPLATE
CHAT_TEMPLATE_QWEN3_VL = CHAT_TEMPLATE.replace(_DEFAULT_SYSTEM, "")

# Qwen2's pre-tokenizer split pattern
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WORDS = (
    "the a an is are what how many colour color shape image picture red green blue yellow purple orange white black "
    "gray cyan magenta brown pink circle square triangle star rectangle ellipse answer think step because so total "
    "left right above below top bottom count object objects there in of and or not yes no please describe solve "
    "equation value number find angle line area length box where which one word with"
).split()


@dataclass(frozen=True)
class TinySpec:
    """Shape of the tiny model (~0.2 M parameters). vLLM's CPU attention needs head_dim >= 32 (hidden / heads)."""

    vocab_size: int = 512
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    vision_hidden: int = 32
    vision_depth: int = 2
    vision_heads: int = 2
    min_pixels: int = 28 * 28 * 4
    max_pixels: int = 28 * 28 * 16
    head_init_std: float = 0.02
    intermediate: int = 0
    """MLP width of the language model (0 = 2 x hidden)."""
    vision_intermediate: int = 0
    """MLP width of the vision blocks (0 = 2 x vision_hidden)."""
    model_vocab_size: int = 0
    """Embedding rows (0 = the tokenizer's size; real checkpoints pad theirs, e.g. 151936)."""
    fullatt_blocks: tuple[int, ...] = ()
    """Vision blocks with full attention (others are windowed); empty = the last block."""
    tie_word_embeddings: bool = False
    """Share the input embedding and the LM head (Qwen2.5-VL-3B does)."""
    family: str = "qwen2_5_vl"
    """Model family (``models.families.FAMILIES``): ``qwen2_5_vl``, ``qwen2_vl``, ``qwen3_vl``, ``qwen3_vl_moe`` or
    ``glm4v`` or ``internvl``."""
    deepstack_layers: int = 2
    """Qwen3-VL: vision blocks whose features DeepStack adds to the first decoder layers (the first blocks)."""
    num_experts: int = 4
    """Qwen3-VL-MoE: experts per MoE layer (2 routed per token)."""
    tool_tokens: bool = False
    """Qwen2.5's ``<tool_call>`` / ``</tool_call>`` tokens, and tool-call JSON in the tokenizer's training text (so
    ``"name"``, ``"arguments"``, ``image_zoom``, ``bbox_2d`` are a few tokens each, as in a real vocabulary): for
    multi-turn tool demos. Off by default, which keeps the default model's vocabulary as it was."""


QWEN25_VL_3B = TinySpec(
    vocab_size=512,
    hidden=2048,
    layers=36,
    heads=16,
    kv_heads=2,
    vision_hidden=1280,
    vision_depth=32,
    vision_heads=16,
    min_pixels=28 * 28 * 4,
    max_pixels=28 * 28 * 256,
    intermediate=11008,
    vision_intermediate=3420,
    model_vocab_size=151936,
    fullatt_blocks=(7, 15, 23, 31),
    tie_word_embeddings=True,
)
"""The shape of Qwen2.5-VL-3B-Instruct (random weights; the tiny tokenizer) for GPU benchmarks."""

TOOL_DEMO = TinySpec(vocab_size=1024, tool_tokens=True)
"""The tiny model for multi-turn tool demos: Qwen2.5's tool-call tokens, and a vocabulary large enough that the
hermes system message listing a tool is ~230 tokens instead of ~480 (``examples/tool_zoom_cpu.sh``)."""

PRESET_20M = TinySpec(hidden=512, layers=8, heads=8, kv_heads=2, vision_hidden=256, vision_depth=4, vision_heads=4)
"""~23 M parameters (language model 18.4 M, vision tower 4.5 M): the tiny tokenizer (vocab 512), so the parameters
are in the transformer, not in embeddings; head_dim 64 in both towers (vLLM's CPU attention needs >= 32 in the
language model)."""

PRESET_100M = TinySpec(hidden=1024, layers=10, heads=16, kv_heads=4, vision_hidden=384, vision_depth=6, vision_heads=6)
"""~103 M parameters (language model 90.2 M, vision tower 13.3 M), the tiny tokenizer; head_dim 64 in both towers."""

TINY_QWEN3_VL = TinySpec(family="qwen3_vl", min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16)
"""The tiny Qwen3-VL: the tiny shape, 32-px merged tokens (4 to 16 tokens per image, as the tiny Qwen2.5-VL)."""

TINY_QWEN3_VL_MOE = replace(TINY_QWEN3_VL, family="qwen3_vl_moe")
"""The tiny Qwen3-VL-MoE: Qwen3-VL's tiny shape with 4 experts (2 per token) in every decoder layer."""

TINY_QWEN2_VL = TinySpec(family="qwen2_vl")
"""The tiny Qwen2-VL: the tiny shape, Qwen2-VL's vision tower (full attention in every block, no window) and
``Qwen2VLProcessor``; its videos' temporal positions are frame-pair indices (no ``tokens_per_second``)."""

TINY_INTERNVL = TinySpec(family="internvl")
"""The tiny InternVL: the tiny shape, InternVL's tokens and template on the same trained vocabulary, 56-px tiles of
4 tokens (1 to 4 tiles and a thumbnail: 8 to 20 tokens per image)."""

TINY_SMOLVLM = TinySpec(family="smolvlm")
"""The tiny SmolVLM: the tiny shape, SmolVLM's tokens and template on the same trained vocabulary, 56-px tiles of 4
tokens in a grid of up to 2 x 2 and a global view (4 to 20 tokens per image, behind row / column tokens)."""

TINY_IDEFICS3 = TinySpec(family="idefics3")
"""The tiny Idefics3 (SmolVLM v1's architecture): the tiny SmolVLM's shape and tiles through ``Idefics3Processor`` and
``Idefics3ForConditionalGeneration``, no video token (a model type of the SmolVLM family)."""

TINY_LLAVA_ONEVISION = TinySpec(family="llava_onevision")
"""The tiny LLaVA-OneVision: the tiny shape, its tokens and template on the same trained vocabulary, a 56-px base view
of 16 tokens plus anyres patches (a prompt's only image: 2 to 4 patches and newline rows)."""

TINY_GEMMA3 = TinySpec(family="gemma3")
"""The tiny Gemma 3: the tiny shape, Gemma's tokens, newline tokens and template on the same trained vocabulary, one
56-px image of 4 tokens per image (bidirectional inside), a sliding-window layer (24 tokens) and a global one."""

TINY_GLM4V = TinySpec(family="glm4v")
"""The tiny GLM-4.1V: the tiny shape, GLM's special tokens and chat template on the same trained vocabulary,
28-px merged tokens (4 to 16 tokens per image, as the tiny Qwen2.5-VL)."""

FAMILY_SPECS: dict[str, TinySpec] = {
    "qwen2_5_vl": TinySpec(),
    "qwen2_vl": TINY_QWEN2_VL,
    "qwen3_vl": TINY_QWEN3_VL,
    "qwen3_vl_moe": TINY_QWEN3_VL_MOE,
    "glm4v": TINY_GLM4V,
    "internvl": TINY_INTERNVL,
    "smolvlm": TINY_SMOLVLM,
    "idefics3": TINY_IDEFICS3,
    "llava_onevision": TINY_LLAVA_ONEVISION,
    "gemma3": TINY_GEMMA3,
}
"""The tiny model of each family (``--family``; Qwen2-VL is a model type of the Qwen2.5-VL family)."""

SIZES: dict[str, TinySpec] = {"tiny": TinySpec(), "20m": PRESET_20M, "100m": PRESET_100M}
"""Model-size presets by name (``--size``; benchmarks' ``--model-size``): language model and vision tower grow
together, the MLPs are 2 x hidden wide (``TinySpec`` defaults), the vocabulary stays the tiny tokenizer's."""


def _corpus(seed: int, tools: bool = False) -> list[str]:
    from vlmrl.tools import hermes
    from vlmrl.tools.builtin import BUILTIN  # torch: off the cache-hit path

    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        words = " ".join(rng.choice(_WORDS) for _ in range(12))
        lines.append(f"What is {a} + {b}? <think>{a} plus {b} is {a + b}</think> <answer>{a + b}</answer> {words}.\n")
        lines.append(f"The answer is \\boxed{{{a}}}. [{a}, {b}, {a + b}, {b + 7}] {words.capitalize()}!\n")
        if tools:  # the JSON of hermes tool calls and results (the tags themselves are added tokens)
            box = sorted(rng.sample(range(112), 2)) + sorted(rng.sample(range(112), 2))
            lines.append(
                f'\n{{"name": "image_zoom", "arguments": {{"bbox_2d": [{box[0]}, {box[2]}, {box[1]}, '
                f"{box[3]}]}}}}\n <tool_response>Zoomed in on the region {box}.</tool_response>\n"
            )
            lines.append(f'\n{{"name": "calculator", "arguments": {{"expression": "{a} + {b}"}}}}\n')
    if tools:  # the hermes system message listing the built-in tools (a real vocabulary has its words)
        schemas = [cls.default_schema for cls in BUILTIN.values() if cls.default_schema]
        lines += [hermes.system_prompt([s]) + "\n" for s in schemas for _ in range(100)]
    lines.append("system\nYou are a helpful assistant.\nuser\nassistant\n")
    return lines


def _specials(spec: TinySpec) -> tuple[list[str], list[str]]:
    """The family's special tokens, added after the trained vocabulary, and the further added tokens its size counts
    (Qwen2.5's tool tokens; Gemma's newline runs)."""
    if spec.family == "glm4v":
        specials = tiny_glm4v.SPECIAL_TOKENS
    elif spec.family == "gemma3":
        specials = tiny_gemma3.SPECIAL_TOKENS
    elif spec.family == "llava_onevision":  # Qwen2's tokenizer: three special tokens, no vision ones
        specials = SPECIAL_TOKENS[:3]
    else:
        specials = SPECIAL_TOKENS
    more = (TOOL_TOKENS if spec.tool_tokens else []) + (list(tiny_gemma3.NEWLINES) if spec.family == "gemma3" else [])
    return list(specials), more


def _trained_bpe(spec: TinySpec, seed: int, vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` with Qwen's pre-tokenizer, trained on the tiny corpus to
    ``vocab_size`` tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(seed, spec.tool_tokens), trainer=trainer)
    return tok


def build_tokenizer(spec: TinySpec = TinySpec(), seed: int = 0):  # noqa: B008
    """A byte-level BPE tokenizer trained locally, carrying every Qwen special token and the Qwen2.5-VL template (the
    Qwen3-VL template for Qwen3-VL; another family's special tokens and template for it, on the same trained
    vocabulary)."""
    from transformers import Qwen2TokenizerFast

    specials, more = _specials(spec)
    tok = _trained_bpe(spec, seed, spec.vocab_size - len(specials) - len(more))
    tok.add_special_tokens(specials)  # appended at the end of the vocabulary, like Qwen's
    if spec.family == "glm4v":
        return tiny_glm4v.tokenizer(tok)
    if spec.family == "gemma3":
        return tiny_gemma3.tokenizer(tok)
    llava = spec.family == "llava_onevision"
    internvl = spec.family == "internvl"
    if internvl:  # InternVL3's tokenizer: Qwen2.5's and InternVL's own vision tokens after them
        tok.add_special_tokens(list(tiny_internvl.EXTRA_TOKENS.values()))
    if llava:  # its tokenizer: Qwen2's and its <image> / <video> after them
        tok.add_special_tokens(list(tiny_llava_onevision.EXTRA_TOKENS))
    smolvlm = spec.family in ("smolvlm", "idefics3")
    if smolvlm:  # SmolVLM's own tokens after the trained vocabulary and Qwen's special tokens
        tok.add_special_tokens(tiny_smolvlm.added_tokens(spec.family))
    if spec.tool_tokens:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<end_of_utterance>" if smolvlm else "<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=specials[1:]
        + (tiny_smolvlm.added_tokens(spec.family) if smolvlm else [])
        + (list(tiny_llava_onevision.EXTRA_TOKENS) if llava else []),
        model_max_length=32768,
        padding_side="left",
        chat_template=_template(spec),
        errors="replace",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        **({"extra_special_tokens": tiny_internvl.EXTRA_TOKENS} if internvl else {}),
    )


def _template(spec: TinySpec) -> str:
    if spec.family == "internvl":
        return tiny_internvl.CHAT_TEMPLATE
    if spec.family in ("smolvlm", "idefics3"):
        return tiny_smolvlm.chat_template(spec.family)
    if spec.family == "llava_onevision":
        return tiny_llava_onevision.CHAT_TEMPLATE
    return CHAT_TEMPLATE if spec.family in ("qwen2_5_vl", "qwen2_vl") else CHAT_TEMPLATE_QWEN3_VL


def build_processor(tokenizer, spec: TinySpec = TinySpec()):  # noqa: B008
    """The family's real processor (``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``) with small min/max pixels (few
    image tokens per image)."""
    from transformers import Qwen2VLImageProcessor

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    if spec.family == "glm4v":
        return tiny_glm4v.processor(tokenizer, spec.min_pixels, spec.max_pixels)
    if spec.family == "internvl":
        return tiny_internvl.processor(tokenizer)
    if spec.family in ("smolvlm", "idefics3"):
        return tiny_smolvlm.processor(tokenizer, spec.family)
    if spec.family == "llava_onevision":
        return tiny_llava_onevision.processor(tokenizer)
    if spec.family == "gemma3":
        return tiny_gemma3.processor(tokenizer)
    if spec.family in ("qwen2_5_vl", "qwen2_vl"):
        from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        common = dict(size=size, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels, patch_size=14)
        ip = Qwen2VLImageProcessor(temporal_patch_size=2, merge_size=2, **common)
        vp = Qwen2VLVideoProcessor(temporal_patch_size=2, merge_size=2, **common)
        cls = Qwen2_5_VLProcessor if spec.family == "qwen2_5_vl" else Qwen2VLProcessor
        return cls(image_processor=ip, video_processor=vp, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    # Qwen3-VL's processors: 16-px patches; the image processor's size bounds one image, the video processor's a
    # whole video (vlmrl resizes frames itself and passes them with do_resize=False)
    ip = Qwen2VLImageProcessor(
        size=size, patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    vp = Qwen3VLVideoProcessor(
        size=size, patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return Qwen3VLProcessor(image_processor=ip, video_processor=vp, tokenizer=tokenizer, chat_template=_template(spec))


def model_config(tokenizer, spec: TinySpec = TinySpec()):  # noqa: B008
    """The model config of a spec (``Qwen2_5_VLConfig`` / ``Qwen3VLConfig`` / ``Qwen3VLMoeConfig``; token ids from
    ``tokenizer``)."""
    if spec.family == "glm4v":
        return tiny_glm4v.config(tokenizer, spec, text_shape(tokenizer, spec), vision_shape(spec, 14))
    if spec.family == "internvl":
        return tiny_internvl.config(tokenizer, spec, text_shape(tokenizer, spec))
    if spec.family in ("smolvlm", "idefics3"):
        return tiny_smolvlm.config(tokenizer, spec, text_shape(tokenizer, spec))
    if spec.family == "llava_onevision":
        return tiny_llava_onevision.config(tokenizer, spec, text_shape(tokenizer, spec))
    if spec.family == "gemma3":
        return tiny_gemma3.config(tokenizer, spec, text_shape(tokenizer, spec))
    if spec.family not in ("qwen2_5_vl", "qwen2_vl"):
        return _qwen3_vl_config(tokenizer, spec)
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    mrope = _mrope_section(spec)
    text = dict(
        **text_shape(tokenizer, spec),
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    vision = _qwen2_vision_config(spec)
    config = (Qwen2VLConfig if spec.family == "qwen2_vl" else Qwen2_5_VLConfig)(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # older readers look at the top level
        setattr(config, k, text[k])
    return config


def text_shape(tokenizer, spec: TinySpec) -> dict:
    """The language model's shape of a spec, as every family's text config names it (the vocabulary: the
    tokenizer's size, or ``model_vocab_size``)."""
    return dict(
        vocab_size=spec.model_vocab_size or len(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate or 2 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
    )


def vision_shape(spec: TinySpec, patch_size: int) -> dict:
    """The vision tower's shape of a spec, as the Qwen2.5-VL, Qwen3-VL and GLM-4.1V vision configs name it
    (``patch_size``-px patches merged 2 x 2, frame pairs, RGB)."""
    return dict(
        depth=spec.vision_depth,
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate or 2 * spec.vision_hidden,
        num_heads=spec.vision_heads,
        out_hidden_size=spec.hidden,
        patch_size=patch_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )


def _qwen2_vision_config(spec: TinySpec) -> dict:
    """The vision tower's config of a Qwen2.5-VL (windowed attention) or Qwen2-VL spec."""
    if spec.family == "qwen2_vl":  # Qwen2-VL's tower: full attention, fixed-width MLP, no time scaling of videos
        return dict(
            depth=spec.vision_depth,
            embed_dim=spec.vision_hidden,
            hidden_size=spec.hidden,
            mlp_ratio=2,
            num_heads=spec.vision_heads,
            in_channels=3,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        )
    return dict(
        **vision_shape(spec, 14),
        window_size=112,
        fullatt_block_indexes=list(spec.fullatt_blocks) or [spec.vision_depth - 1],
        tokens_per_second=2,
    )


def _mrope_section(spec: TinySpec) -> list[int]:
    half = (spec.hidden // spec.heads) // 2  # mrope_section (t, h, w) sums to head_dim / 2
    return [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]


def _qwen3_vl_config(tokenizer, spec: TinySpec):
    """Qwen3-VL's (or Qwen3-VL-MoE's) config of a spec: Qwen3 text model (q/k norms, explicit head_dim), interleaved
    M-RoPE, a vision tower of 16-px patches with DeepStack mergers after its first ``deepstack_layers`` blocks."""
    from transformers import Qwen3VLConfig, Qwen3VLMoeConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(
        **text_shape(tokenizer, spec),
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": _mrope_section(spec),
            "mrope_interleaved": True,
        },
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    if spec.family == "qwen3_vl_moe":
        # expert width != hidden: transformers tells its two layouts of a fused expert weight apart by shape only
        # (a square down_proj would load as saved, transposed)
        text.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=2,
            moe_intermediate_size=spec.hidden * 3 // 2,
            decoder_sparse_step=1,
        )
    vision = _qwen3_vision_config(spec)
    cls = Qwen3VLMoeConfig if spec.family == "qwen3_vl_moe" else Qwen3VLConfig
    config = cls(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # older readers look at the top level
        setattr(config, k, text[k])
    if spec.family == "qwen3_vl_moe":  # as the hub's config.json has it (vLLM reads it; transformers always does so)
        config.text_config.norm_topk_prob = True
    return config


def _qwen3_vision_config(spec: TinySpec) -> dict:
    """Qwen3-VL's vision tower: 16-px patches, learned position embeddings, DeepStack mergers."""
    return dict(
        **vision_shape(spec, 16),
        num_position_embeddings=256,
        deepstack_visual_indexes=list(range(min(spec.deepstack_layers, spec.vision_depth))),
    )


def _model_class(spec: TinySpec):
    import transformers

    names = {
        "qwen2_5_vl": "Qwen2_5_VL",
        "qwen2_vl": "Qwen2VL",
        "qwen3_vl": "Qwen3VL",
        "qwen3_vl_moe": "Qwen3VLMoe",
        "glm4v": "Glm4v",
        "internvl": "InternVL",
        "smolvlm": "SmolVLM",
        "idefics3": "Idefics3",
        "llava_onevision": "LlavaOnevision",
        "gemma3": "Gemma3",
    }
    name = names[spec.family]
    return getattr(transformers, f"{name}ForConditionalGeneration")


def generation_config(tokenizer, family: str = "qwen2_5_vl"):
    """The family's generation defaults (Qwen: both end tokens stop; GLM-4.1V: its end and next-role tokens; plain
    sampling)."""
    from transformers import GenerationConfig

    ends = {
        "glm4v": tiny_glm4v.END_TOKENS,
        "smolvlm": tiny_smolvlm.END_TOKENS,
        "idefics3": tiny_smolvlm.END_TOKENS,
        "gemma3": tiny_gemma3.END_TOKENS,
    }.get(family, ("<|im_end|>", "<|endoftext|>"))
    pad = tokenizer.convert_tokens_to_ids("<pad>" if family == "gemma3" else "<|endoftext|>")
    return GenerationConfig(
        bos_token_id=pad,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ends],
        pad_token_id=pad,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )


def build_model(tokenizer, spec: TinySpec = TinySpec(), seed: int = 0):  # noqa: B008
    """A randomly initialised ``...ForConditionalGeneration`` of the spec's family (vision tower, patch merger,
    M-RoPE; DeepStack for Qwen3-VL)."""
    import torch

    config = model_config(tokenizer, spec)
    torch.manual_seed(seed)
    model = _model_class(spec)(config).float()
    if spec.family == "gemma3":
        tiny_gemma3.init_weights(model)
    with torch.no_grad():  # small head: a near-uniform first policy that explores
        model.lm_head.weight.normal_(0.0, spec.head_init_std)
    model.generation_config = generation_config(tokenizer, spec.family)
    return model


def spec_overrides(spec: TinySpec) -> dict[str, object]:
    """The fields of ``spec`` that differ from the default ``TinySpec()`` (``TinySpec(**spec_overrides(s)) == s``)."""
    default = asdict(TinySpec())
    return {k: getattr(spec, k) for k, v in asdict(spec).items() if v != default[k]}


def param_counts(spec: TinySpec = TinySpec()) -> dict[str, int]:  # noqa: B008
    """Parameters of a spec's model, counted on the meta device (no memory, no weights; ~0.1 s): ``total``,
    ``vision_tower`` (patch embedding, blocks, patch merger), ``language_model`` (everything else: embeddings,
    decoder layers, final norm, LM head) and ``embedding`` (the input embedding; the LM head too when tied)."""
    import torch

    config = model_config(build_tokenizer(spec), spec)
    with torch.device("meta"):
        model = _model_class(spec)(config)
    total = sum(p.numel() for p in model.parameters())  # tied weights are one parameter, counted once
    from vlmrl.models.families import family_of

    vision = sum(
        p.numel() for m in family_of(model.config).vision_modules for p in getattr(model.model, m).parameters()
    )
    embedding = model.get_input_embeddings().weight.numel()
    return {"total": total, "language_model": total - vision, "vision_tower": vision, "embedding": embedding}


def build_tiny_model(output: str | os.PathLike, seed: int = 0, spec: TinySpec = TinySpec()) -> Path:  # noqa: B008
    """Build the tiny model, its tokenizer and processor into ``output`` (an HF folder) and return its path."""
    from vlmrl.models import qwen_vl  # torch: off the cache-hit path

    out = Path(output)
    tok = build_tokenizer(spec, seed)
    proc = build_processor(tok, spec)
    model = build_model(tok, spec, seed)
    out.mkdir(parents=True, exist_ok=True)
    qwen_vl.save_pretrained(model, out)  # the hub's layout (Qwen3-VL-MoE's fused experts)
    proc.save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"builder_version": BUILDER_VERSION, "seed": seed, "spec": asdict(spec)}
    (out / "vlmrl_tiny.json").write_text(json.dumps(meta, indent=2))
    return out


def cache_root() -> Path:
    """Where cached tiny models live: ``$VLMRL_CACHE`` or ``~/.cache/vlmrl``."""
    return Path(os.environ.get("VLMRL_CACHE", Path.home() / ".cache" / "vlmrl"))


def ensure_tiny_model(seed: int = 0, spec: TinySpec = TinySpec()) -> Path:  # noqa: B008
    """The cached tiny model for ``seed`` (built once, atomically, so parallel processes can share it)."""
    tag = (
        ""
        if spec == TinySpec()
        else "-" + hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:10]
    )
    name = "qwen25vl" if spec.family == "qwen2_5_vl" else spec.family.replace("_", "")
    final = cache_root() / f"tiny-{name}-v{BUILDER_VERSION}-seed{seed}{tag}"
    return cached_build(final, "vlmrl_tiny.json", lambda tmp: build_tiny_model(tmp, seed, spec))


def cached_build(final: Path, marker: str, build: Callable[[Path], object]) -> Path:
    """``final``, built once by ``build(folder)`` into a temporary folder beside it and renamed into place (so
    parallel processes share it; the one that loses the race keeps the winner's); ``marker`` is the file whose
    presence means it is complete."""
    if (final / marker).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race
            if not (final / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    """CLI: ``python -m vlmrl.testing.tiny --output DIR [--seed N] [--size tiny|20m|100m] [--family NAME]``; the
    shape flags override the preset's fields."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", required=True, help="folder to write the HF checkpoint to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=list(SIZES), default="tiny", help="model-size preset (default: tiny)")
    ap.add_argument(
        "--family",
        choices=list(FAMILY_SPECS),
        default="qwen2_5_vl",
        help="model family (default: qwen2_5_vl); Qwen3-VL's use 32-px merged tokens, GLM-4.1V its own tokens, "
        "InternVL 56-px tiles",
    )
    ap.add_argument("--hidden", type=int, help="override the preset's hidden size")
    ap.add_argument("--layers", type=int, help="override the preset's decoder layers")
    ap.add_argument("--vision-hidden", type=int, help="override the preset's vision hidden size")
    ap.add_argument("--vision-depth", type=int, help="override the preset's vision blocks")
    ap.add_argument("--vocab-size", type=int, help="override the preset's vocabulary size")
    ap.add_argument("--tool-tokens", action="store_true", help="add Qwen2.5's <tool_call> tokens (tool demos)")
    a = ap.parse_args(argv)
    fields = ("hidden", "layers", "vision_hidden", "vision_depth", "vocab_size")
    given = {f: getattr(a, f) for f in fields if getattr(a, f) is not None}
    spec = replace(SIZES[a.size], **given, **({"tool_tokens": True} if a.tool_tokens else {}))
    if a.family != "qwen2_5_vl":
        fam = FAMILY_SPECS[a.family]
        spec = replace(spec, family=fam.family, min_pixels=fam.min_pixels, max_pixels=fam.max_pixels)
    out = build_tiny_model(a.output, a.seed, spec)
    size = sum(f.stat().st_size for f in out.iterdir())
    files = sorted(p.name for p in out.iterdir())
    print(
        json.dumps(
            {"output": str(out), "seed": a.seed, "size": a.size, "family": spec.family, "bytes": size, "files": files}
        )
    )


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    main()
