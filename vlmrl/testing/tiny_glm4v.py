"""The tiny GLM-4.1V's pieces (``python -m vlmrl.testing.tiny --family glm4v``): GLM's special tokens and chat
template on the tiny tokenizer's trained vocabulary, ``Glm4vProcessor`` (its image processor bounds an image's area
counted as two frames) and a ``Glm4vConfig`` of the tiny shape (GLM-4's partial rotary dimension, 3-D M-RoPE)."""

from __future__ import annotations

from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
]
"""GLM-4.1V's special tokens (its tokenizer's added tokens that vlmrl reads), appended after the trained vocabulary."""

END_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
"""What ends an assistant turn (GLM-4.1V's generation config: the model starts the next turn's role token)."""

# GLM-4.1V-9B-Thinking's chat template for plain and vision content (chat_template.jinja), its whitespace kept
CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- for msg in messages %}"
    "{%- if msg.role == 'system' %}<|system|>\n{{ msg.content }}"
    "{%- elif msg.role == 'user' %}<|user|>{{ '\\n' }}"
    "{%- if msg.content is string %}{{ msg.content }}{%- else %}{%- for item in msg.content %}"
    "{%- if item.type == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif item.type == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- elif msg.role == 'assistant' %}<|assistant|>{{ '\\n' }}{{ msg.content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{{ '\\n' }}{%- endif %}"
)


def tokenizer(trained: Any) -> Any:
    """GLM's tokenizer around a trained ``tokenizers.Tokenizer`` that already carries :data:`SPECIAL_TOKENS`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=trained,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=32768,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def processor(tok: Any, min_pixels: int, max_pixels: int) -> Any:
    """``Glm4vProcessor``: 14-px patches merged 2 x 2, its image processor's ``size`` two frames of the area bounds
    (as GLM-4.1V's preprocessor config counts them)."""
    from transformers import Glm4vImageProcessor, Glm4vProcessor
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor

    size = {"shortest_edge": 2 * min_pixels, "longest_edge": 2 * max_pixels}
    common = dict(size=size, patch_size=14, temporal_patch_size=2, merge_size=2)
    return Glm4vProcessor(
        image_processor=Glm4vImageProcessor(**common),
        video_processor=Glm4vVideoProcessor(**common),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
    )


def config(tok: Any, spec: Any, text_shape: dict, vision_shape: dict) -> Any:
    """A ``Glm4vConfig`` of the spec's shape: GLM-4's decoder (half the head's dimensions rotated, 3-D M-RoPE
    sections over them) and GLM-4.1V's vision tower (14-px patches, learned position embeddings). ``text_shape``
    and ``vision_shape`` are the shapes every family's tiny config shares (``tiny.text_shape`` /
    ``tiny.vision_shape(spec, 14)``)."""
    from transformers import Glm4vConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    rotary_half = (spec.hidden // spec.heads) // 4  # partial_rotary_factor 0.5: sections sum to head_dim / 4
    third = rotary_half * 3 // 8
    text = dict(
        **text_shape,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [rotary_half - 2 * third, third, third],
            "partial_rotary_factor": 0.5,
        },
        attention_bias=True,  # GLM-4.1V's config says so: vLLM builds q/k/v biases only then (transformers always)
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids[t] for t in END_TOKENS],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    vision = dict(**vision_shape, image_size=112)
    return Glm4vConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
