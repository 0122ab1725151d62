"""Gemma 3 (``gemma3``: the 4B / 12B / 27B vision checkpoints): a SigLIP tower over one square image (each image
resized to the tower's ``image_size``; pan-and-scan crops off, as the hub's processors have them), average-pooled to
``mm_tokens_per_image`` tokens and projected, and a Gemma 3 decoder: 1-D RoPE with a local and a global base,
sliding-window layers between global ones, and **bidirectional attention inside each image's tokens** (an image
token sees every token of its own image, later ones included; everything else is causal).

What differs from the Qwen path: images are not resized by the dataset (the processor resizes them), an image's
single ``<start_of_image>`` becomes ``\\n\\n<start_of_image>`` + ``mm_tokens_per_image`` x ``<image_soft_token>`` +
``<end_of_image>\\n\\n`` with the newlines merged into their neighbours' as Gemma's tokenizer writes them
(``models.tiles.GemmaTiling``), positions are one per token, and every forward marks the image tokens
(``token_type_ids``) so the attention treats them as transformers does: the padded and shared-prompt forwards through
transformers' own masks, the packed forward through vlmrl's segments (``models.packing``: image blocks and the
sliding window), the HF rollout through ``generate``'s first pass. vLLM's CPU attention has no bidirectional
image attention (it would attend causally where the trainer does not), so Gemma 3 rolls out with the HF rollout on
CPU (``rollout.name=vllm`` is refused there by name). vlmrl trains it on images and text; videos (Gemma 3 has no
video input) and multi-turn tool rollouts (Qwen's hermes turns) are refused by name."""

from vlmrl.models import tiles
from vlmrl.models.families.base import Family

GEMMA3 = Family(
    name="gemma3",
    label="Gemma 3",
    model_types=("gemma3",),
    patch_size=14,
    vision_tokens=("<start_of_image>", "<video>", "<start_of_image>", "<end_of_image>"),
    never_sample=("<image_soft_token>",),
    image_processor_classes=("Gemma3ImageProcessor", "Gemma3ImageProcessorFast", "Gemma3ImageProcessorPil"),
    videos=False,
    tool_turns=False,
    processor_classes=("Gemma3Processor",),
    mrope=False,
    tiles=tiles.GEMMA,
    vision_modules=("vision_tower", "multi_modal_projector"),
    vision_blocks="vision_tower.encoder.layers",
    renames=(("vision_tower.", "vision_tower.vision_model."),),  # transformers 5.19 drops SigLIP's level, as LLaVA-OV's
    bidirectional_images=True,
)
