"""Qwen3-VL (dense): 16-px patches (32 px per merged token), text timestamps before each temporal patch of a video,
DeepStack features into the decoder's first layers, interleaved M-RoPE sections (in the checkpoint's config)."""

from vlmrl.models.families.base import Family

QWEN3_VL = Family(
    name="qwen3_vl",
    label="Qwen3-VL",
    model_types=("qwen3_vl",),
    patch_size=16,
    processor_classes=("Qwen3VLProcessor",),
    video_timestamps=True,
    deepstack=True,
)
