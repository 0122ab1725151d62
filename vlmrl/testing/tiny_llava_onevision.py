"""The tiny LLaVA-OneVision's pieces (``python -m vlmrl.testing.tiny --family llava_onevision``): LLaVA-OneVision's
``<image>`` and ``<video>`` tokens and chat template on the tiny Qwen tokenizer's trained vocabulary (its tokenizer is
Qwen2's plus those two), ``LlavaOnevisionProcessor`` with ``LlavaOnevisionImageProcessor`` (a 56-px base view plus
anyres patches at pinpoints up to 112 x 112 / 56 x 168), and a ``LlavaOnevisionConfig`` of the tiny shape: a SigLIP
tower (14-px patches, 16 tokens a patch), a projector, an image newline and a Qwen2 decoder with 1-D RoPE."""

from __future__ import annotations

from typing import Any

from vlmrl.testing import tiny_parts

EXTRA_TOKENS = ("<image>", "<video>")
"""LLaVA-OneVision's added tokens (after Qwen's special tokens, as its tokenizer has them)."""

TILE = 56
"""Pixels a side of the base view and of each patch (the hub's: 384)."""
PINPOINTS = [[TILE, TILE], [TILE, 2 * TILE], [2 * TILE, TILE], [2 * TILE, 2 * TILE], [TILE, 3 * TILE], [3 * TILE, TILE]]
"""The anyres resolutions (the hub's: multiples of 384 up to 2304)."""

# llava-hf/llava-onevision-qwen2-*-ov-hf's chat template (images, then videos, then the text of each message)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{% if message['content'] is string %}{{ '\\n' + message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% endif %}{{'<|im_end|>\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def processor(tok: Any) -> Any:
    """``LlavaOnevisionProcessor``: a :data:`TILE`-px base view, anyres patches at :data:`PINPOINTS`."""
    from transformers import LlavaOnevisionImageProcessor, LlavaOnevisionProcessor
    from transformers.models.llava_onevision.video_processing_llava_onevision import LlavaOnevisionVideoProcessor

    size = {"height": TILE, "width": TILE}
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=PINPOINTS),
        tokenizer=tok,
        video_processor=LlavaOnevisionVideoProcessor(size=size),
        num_image_tokens=(TILE // 14) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_9",
        chat_template=CHAT_TEMPLATE,
    )


def config(tok: Any, spec: Any, text_shape: dict) -> Any:
    """A ``LlavaOnevisionConfig`` of the spec's shape (``text_shape``: ``tiny.text_shape``)."""
    from transformers import LlavaOnevisionConfig

    text = tiny_parts.qwen2_text(tok, spec, text_shape)
    vision = dict(
        model_type="siglip_vision_model",
        **tiny_parts.vit_sizes(spec),
        image_size=TILE,
        patch_size=14,
    )
    return LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_grid_pinpoints=PINPOINTS,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=spec.tie_word_embeddings,
    )
