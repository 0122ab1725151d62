"""Config pieces the tiled families' tiny builders share (``tiny_internvl``, ``tiny_smolvlm``,
``tiny_llava_onevision``): a Qwen2 decoder's text config on the tiny tokenizer and a ViT tower's sizes of a spec."""

from __future__ import annotations

from typing import Any


def qwen2_text(tok: Any, spec: Any, text_shape: dict) -> dict:
    """A Qwen2 decoder's text config of the spec's shape (``text_shape``: ``tiny.text_shape``), 1-D RoPE, Qwen's
    end, pad and begin tokens (InternVL's and LLaVA-OneVision's decoders)."""
    return dict(
        **text_shape,
        model_type="qwen2",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=spec.tie_word_embeddings,
    )


def vit_sizes(spec: Any) -> dict:
    """A ViT tower's sizes of the spec (hidden, blocks, heads, MLP width), as InternViT's, SigLIP's and SmolVLM's
    vision configs name them."""
    return dict(
        hidden_size=spec.vision_hidden,
        num_hidden_layers=spec.vision_depth,
        num_attention_heads=spec.vision_heads,
        intermediate_size=spec.vision_intermediate or 2 * spec.vision_hidden,
    )
