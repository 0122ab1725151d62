"""LLaVA-OneVision (``llava_onevision``, transformers' own implementation: the ``llava-hf/llava-onevision-*-hf``
checkpoints): a SigLIP tower, "anyres" images (a base view of the whole image plus patches at the best of the
config's ``image_grid_pinpoints``, their features unpadded to the image's aspect ratio, pooled past
``vision_aspect_ratio``'s patch count, a learned ``image_newline`` row after each feature row), an MLP projector and a
Qwen2 decoder with plain 1-D RoPE.

What differs from the Qwen path: images are not resized by the dataset (the processor patches them), an image's
single ``<image>`` becomes the processor's count of ``<image>`` tokens with nothing around them, an image that shares
its prompt with others is its base view only (``batch_num_images``: the count then depends on the prompt, which the
dataset's length count follows), positions are one per token, and the features come out of ``get_image_features``
with the images' sizes (``models.tiles.AnyresTiling``). transformers 5.19 holds and writes the SigLIP tower without
its ``vision_model.`` level, which the hub's checkpoints and vLLM's loader have: checkpoints and pushes carry the
hub's names (``Family.renames``). vlmrl trains it on images and text; videos and multi-turn tool rollouts (Qwen's
hermes turns) are refused by name."""

from vlmrl.models import tiles
from vlmrl.models.families.base import Family

LLAVA_ONEVISION = Family(
    name="llava_onevision",
    label="LLaVA-OneVision",
    model_types=("llava_onevision",),
    patch_size=14,
    vision_tokens=("<image>", "<video>", "<image>", "<image>"),  # (no vision start / end: the pad stands for them)
    image_processor_classes=tuple(f"LlavaOnevisionImageProcessor{k}" for k in ("", "Fast", "Pil")),
    videos=False,
    tool_turns=False,
    hf_repeat_prompts=True,
    processor_classes=("LlavaOnevisionProcessor",),
    mrope=False,
    tiles=tiles.ANYRES,
    vision_modules=("vision_tower", "multi_modal_projector"),
    vision_blocks="vision_tower.encoder.layers",
    root_vision_params=True,
    renames=(("vision_tower.", "vision_tower.vision_model."),),
)
