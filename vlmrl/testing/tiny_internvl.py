"""The tiny InternVL's pieces (``python -m vlmrl.testing.tiny --family internvl``): InternVL's vision tokens and
chat template on the tiny Qwen tokenizer's trained vocabulary (InternVL3's tokenizer is Qwen2.5's plus its own),
``InternVLProcessor`` with ``GotOcr2ImageProcessor`` tiling images into 56-px tiles (up to 4 and a thumbnail), and an
``InternVLConfig`` of the tiny shape: an InternViT tower (14-px patches, a CLS token), pixel shuffle to 4 tokens a
tile, and a Qwen2 decoder with 1-D RoPE."""

from __future__ import annotations

from typing import Any

from vlmrl.testing import tiny_parts

EXTRA_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
"""InternVL's vision tokens, by the tokenizer attribute ``InternVLProcessor`` reads each from (``tiny.build_tokenizer``
adds them after Qwen's special tokens, as InternVL3's tokenizer has them)."""

TILE = 56
"""Pixels a side of a tile (the hub's checkpoints: 448)."""
MAX_TILES = 4
IMAGE_SEQ_LENGTH = (TILE // 14) ** 2 // 4
"""Tokens per tile: 14-px patches, pixel shuffle by 0.5 (the hub's: 256)."""

# InternVL3-hf's chat template (chat_template.jinja), its whitespace kept
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\\n' }}{% endif %}"
)


def processor(tok: Any) -> Any:
    """``InternVLProcessor``: tiles of :data:`TILE` px, 1 to :data:`MAX_TILES` of them by the image's aspect ratio
    plus a thumbnail, :data:`IMAGE_SEQ_LENGTH` tokens each."""
    from transformers import GotOcr2ImageProcessor, InternVLProcessor
    from transformers.models.internvl.video_processing_internvl import InternVLVideoProcessor

    size = {"height": TILE, "width": TILE}
    ip = GotOcr2ImageProcessor(size=size, crop_to_patches=True, min_patches=1, max_patches=MAX_TILES)
    return InternVLProcessor(
        image_processor=ip,
        tokenizer=tok,
        video_processor=InternVLVideoProcessor(size=size),
        image_seq_length=IMAGE_SEQ_LENGTH,
        chat_template=CHAT_TEMPLATE,
    )


def config(tok: Any, spec: Any, text_shape: dict) -> Any:
    """An ``InternVLConfig`` of the spec's shape (``text_shape``: ``tiny.text_shape``)."""
    from transformers import InternVLConfig

    text = tiny_parts.qwen2_text(tok, spec, text_shape)
    vision = dict(
        **tiny_parts.vit_sizes(spec),
        image_size=[TILE, TILE],
        patch_size=[14, 14],
    )
    return InternVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tok.convert_tokens_to_ids(EXTRA_TOKENS["context_image_token"]),
        image_seq_length=IMAGE_SEQ_LENGTH,
        downsample_ratio=0.5,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
