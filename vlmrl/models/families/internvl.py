"""InternVL (``internvl``, transformers' own implementation: InternVL3 / 3.5 ``-hf`` checkpoints): an InternViT
tower over 448-px tiles (each image cut into up to ``max_patches`` tiles of its aspect ratio, plus a thumbnail),
pixel shuffle to ``image_seq_length`` tokens a tile, an MLP projector, and a Qwen2 decoder with plain 1-D RoPE.

What differs from the Qwen path: images are not resized by the dataset (the processor tiles them; its tile bounds
set the token count), an image's single ``<IMG_CONTEXT>`` becomes ``<img>`` + tiles x ``image_seq_length`` x
``<IMG_CONTEXT>`` + ``</img>``, positions are one per token, and the features come out of
``get_image_features`` tile by tile. Its tokenizer also holds Qwen's vision tokens (its decoder is Qwen2.5's), so
the tokens that name the family are InternVL's own. vlmrl trains it on images and text; videos and multi-turn tool
rollouts (Qwen's hermes turns) are refused by name."""

from vlmrl.models import tiles
from vlmrl.models.families.base import Family

INTERNVL = Family(
    name="internvl",
    label="InternVL",
    model_types=("internvl",),
    patch_size=14,
    vision_tokens=("<IMG_CONTEXT>", "<video>", "<img>", "</img>"),
    image_processor_classes=("GotOcr2ImageProcessor", "GotOcr2ImageProcessorFast", "GotOcr2ImageProcessorPil"),
    videos=False,
    tool_turns=False,
    processor_classes=("InternVLProcessor",),
    mrope=False,
    tiles=tiles.INTERNVL,
    vision_modules=("vision_tower", "multi_modal_projector"),
    vision_blocks="vision_tower.encoder.layer",
)
