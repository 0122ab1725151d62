"""Model families as data: what differs between Qwen2-VL / Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, GLM-4.1V, InternVL,
SmolVLM / Idefics3, LLaVA-OneVision and Gemma 3, chosen from the checkpoint's ``model_type``.

The rest of vlmrl runs one code path for every family; where the families differ it reads a field of :class:`Family`
(``models.qwen_vl`` holds what they share: tokens, images, video sampling, positions, features, weight names):

- ``patch_size``: pixels of a vision patch (14 / 16; merged 2 x 2 into one token: 28 / 32 px);
- ``video_timestamps``: Qwen3-VL writes each temporal patch of a video as ``<t seconds>`` text followed by its own
  ``<|vision_start|>`` + pads + ``<|vision_end|>``, and positions each one like an image; Qwen2(.5)-VL gives the
  video one run of pads and spaces its temporal positions by ``tokens_per_second`` x ``second_per_grid_ts``;
- ``deepstack``: the vision tower also returns features of early blocks that the decoder adds to the vision tokens'
  hidden states in its first layers (vlmrl carries them concatenated after the main features, as vLLM does);
- ``vision_tokens``, ``never_sample``: the tokenizer's image / video pads and vision start / end (Qwen's
  ``<|image_pad|>``..., GLM-4.1V's ``<|image|>``...), and what else a rollout must never generate;
- ``pixel_frames``: GLM-4.1V's image processor bounds an image's area counted as two frames;
- ``mrope``, ``tiles``: InternVL's and SmolVLM's decoders take one position per token, and their processors cut
  images into tiles laid out in the prompt as each family writes them (``models.tiles``); ``vision_modules`` /
  ``vision_blocks`` name their towers' modules (not Qwen's ``visual``);
- ``videos``, ``tool_turns``: what vlmrl trains the family on (the config gate refuses the rest by name);
- ``bidirectional_images``: Gemma 3's image tokens attend to each other both ways (``token_type_ids`` in every
  forward; the packed forward's segments carry the image blocks and the sliding window);
- ``text_model``: the inner model's decoder module (SmolVLM's ``text_model``, not ``language_model``);
- ``moe``, ``moe_not_implemented`` and ``fused_experts``: a mixture-of-experts language model, what vlmrl leaves out
  for it, and the expert weights transformers holds transposed from the checkpoint's layout.

Videos go in as vlmrl sampled and resized them in every family (``models.inputs.VIDEO_AS_GIVEN``: Qwen3-VL's video
processor bounds a whole video's pixels, so it would shrink frames the dataset sized one by one).

The M-RoPE flavour (Qwen3-VL's interleaved sections) lives in the model's own rotary embedding and config
(``rope_parameters.mrope_interleaved``) and in vLLM's; both read it from the checkpoint.
"""

from __future__ import annotations

from typing import Any

from vlmrl.models.families.base import Family
from vlmrl.models.families.gemma3 import GEMMA3
from vlmrl.models.families.glm4v import GLM4V
from vlmrl.models.families.internvl import INTERNVL
from vlmrl.models.families.llava_onevision import LLAVA_ONEVISION
from vlmrl.models.families.qwen2_vl import QWEN2_VL
from vlmrl.models.families.qwen3_vl import QWEN3_VL
from vlmrl.models.families.qwen3_vl_moe import QWEN3_VL_MOE
from vlmrl.models.families.smolvlm import SMOLVLM

FAMILIES: dict[str, Family] = {
    f.name: f for f in (QWEN2_VL, QWEN3_VL, QWEN3_VL_MOE, GLM4V, INTERNVL, SMOLVLM, LLAVA_ONEVISION, GEMMA3)
}
"""Every family vlmrl trains, by name (``python -m vlmrl.testing.tiny --family NAME``)."""

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES.values() for t in f.model_types)


def family_of(config_or_type: Any) -> Family:
    """The family of a model config (or of a ``model_type`` string); ValueError naming the supported types."""
    mt = config_or_type if isinstance(config_or_type, str) else getattr(config_or_type, "model_type", None)
    for f in FAMILIES.values():
        if mt in f.model_types:
            return f
    raise ValueError(
        f"model_type {mt!r} is not supported{closest_family(mt)}; vlmrl trains "
        + "; ".join(f"{f.label} ({', '.join(f.model_types)})" for f in FAMILIES.values())
    )


def closest_family(model_type: object) -> str:
    """`` (the closest: <family>, '<type>', a different architecture)`` for an unsupported ``model_type`` whose
    name is near a supported one's (``glm4v_moe``, a text model's ``qwen2``), else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(model_type), SUPPORTED_MODEL_TYPES, n=1, cutoff=0.6)
    return f" (the closest: {family_of(close[0]).label}, {close[0]!r}, a different architecture)" if close else ""


def family_of_processor(processor: Any) -> Family:
    """The family whose prompt layout a processor makes (by its class; Qwen3-VL-MoE shares Qwen3-VL's processor and
    layout); Qwen2.5-VL's for a processor of another class (vlmrl's checks refuse its model where the model is read)."""
    name = type(processor).__name__
    return next((f for f in FAMILIES.values() if name in f.processor_classes), QWEN2_VL)


def pixel_frames(image_processor: Any) -> int:
    """Frames an image counts as in this image processor's pixel bounds (``Family.pixel_frames``; 1 for a processor
    of no known family)."""
    name = type(image_processor).__name__
    return next((f.pixel_frames for f in FAMILIES.values() if name in f.image_processor_classes), 1)


__all__ = [
    "FAMILIES",
    "SUPPORTED_MODEL_TYPES",
    "Family",
    "closest_family",
    "family_of",
    "family_of_processor",
    "pixel_frames",
]
