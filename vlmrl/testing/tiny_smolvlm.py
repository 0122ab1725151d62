"""The tiny SmolVLM's and Idefics3's pieces (``python -m vlmrl.testing.tiny --family smolvlm|idefics3``): SmolVLM's
vision tokens (``<image>``,
``<fake_token_around_image>``, ``<global-img>``, the grid's ``<row_r_col_c>``) and chat template on the tiny
tokenizer's trained vocabulary, ``SmolVLMProcessor`` with ``SmolVLMImageProcessor`` scaling images to at most 112 px
and cutting them into 56-px tiles (a grid of up to 2 x 2 and a global view), and a ``SmolVLMConfig`` of the tiny
shape: a SigLIP tower (14-px patches), pixel shuffle by 2 to 4 tokens a tile, and a Llama decoder with 1-D RoPE. The
tiny Idefics3 (SmolVLM v1's architecture) takes the same pieces through ``Idefics3Processor`` and ``Idefics3Config``,
without SmolVLM2's video token (its tokenizers have none)."""

from __future__ import annotations

from typing import Any

from vlmrl.testing import tiny_parts

EXTRA_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>", "<video>")
"""SmolVLM's own added tokens (the tokenizer attributes ``SmolVLMProcessor`` reads them from default to these);
``tiny.build_tokenizer`` adds them and the grid's row / column tokens after Qwen's special tokens."""

END_TOKENS = ("<end_of_utterance>", "<|endoftext|>")
"""What ends an assistant turn (SmolVLM's end of utterance)."""

TILE = 56
"""Pixels a side of a tile (SmolVLM2-256M's: 512)."""
LONGEST_EDGE = 2 * TILE
"""The processor scales an image's longest edge to this (so up to 2 x 2 tiles; the hub's: 4 x 512)."""
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (TILE // 14) ** 2 // SCALE_FACTOR**2
"""Tokens per tile: 14-px patches, pixel shuffle by 2 (SmolVLM2-256M's: 64)."""

# SmolVLM2's chat template (transformers' DEFAULT_CHAT_TEMPLATE for SmolVLM), its whitespace kept
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
VIDEO_BRANCH = "{% elif line['type'] == 'video' %}{{ '<video>' }}"
assert VIDEO_BRANCH in CHAT_TEMPLATE


def added_tokens(family: str = "smolvlm") -> list[str]:
    """SmolVLM's tokens the tiny tokenizer adds after Qwen's (special: never split, skipped when decoding; Idefics3:
    no video token)."""
    from vlmrl.models.families.smolvlm import ROW_COL_TOKENS  # torch: off the cache-hit path

    extra = [t for t in EXTRA_TOKENS if family == "smolvlm" or t != "<video>"]
    return [*extra, *ROW_COL_TOKENS]


def chat_template(family: str = "smolvlm") -> str:
    """SmolVLM2's chat template; SmolVLM v1's (Idefics3) without the video branch."""
    return CHAT_TEMPLATE if family == "smolvlm" else CHAT_TEMPLATE.replace(VIDEO_BRANCH, "")


def processor(tok: Any, family: str = "smolvlm") -> Any:
    """``SmolVLMProcessor`` (Idefics3: ``Idefics3Processor``): the longest edge scaled to :data:`LONGEST_EDGE`, tiles
    of :data:`TILE` px in a grid plus a global view, :data:`IMAGE_SEQ_LEN` tokens each."""
    from transformers import Idefics3ImageProcessor, Idefics3Processor, SmolVLMImageProcessor, SmolVLMProcessor
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    sizes = dict(size={"longest_edge": LONGEST_EDGE}, max_image_size={"longest_edge": TILE}, do_image_splitting=True)
    if family == "idefics3":
        return Idefics3Processor(
            image_processor=Idefics3ImageProcessor(**sizes),
            tokenizer=tok,
            image_seq_len=IMAGE_SEQ_LEN,
            chat_template=chat_template(family),
        )
    ip = SmolVLMImageProcessor(**sizes)
    vp = SmolVLMVideoProcessor(size={"longest_edge": TILE}, max_image_size={"longest_edge": TILE})
    return SmolVLMProcessor(
        image_processor=ip, tokenizer=tok, video_processor=vp, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE
    )


def config(tok: Any, spec: Any, text_shape: dict) -> Any:
    """A ``SmolVLMConfig`` (Idefics3: ``Idefics3Config``) of the spec's shape (``text_shape``: ``tiny.text_shape``)."""
    from transformers import Idefics3Config, SmolVLMConfig

    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    text = dict(
        **text_shape,
        model_type="llama",
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5},
        eos_token_id=tok.convert_tokens_to_ids("<end_of_utterance>"),
        pad_token_id=pad,
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    vision = dict(
        **tiny_parts.vit_sizes(spec),
        image_size=TILE,
        patch_size=14,
    )
    return (Idefics3Config if spec.family == "idefics3" else SmolVLMConfig)(
        vision_config=vision,
        text_config=text,
        scale_factor=SCALE_FACTOR,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=pad,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
