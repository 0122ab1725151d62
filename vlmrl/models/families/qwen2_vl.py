"""Qwen2-VL and Qwen2.5-VL: 14-px patches, one run of video pads with time-scaled temporal positions, no DeepStack."""

from vlmrl.models.families.base import Family

QWEN2_VL = Family(
    name="qwen2_5_vl",
    label="Qwen2.5-VL / Qwen2-VL",
    model_types=("qwen2_5_vl", "qwen2_vl"),
    patch_size=14,
    processor_classes=("Qwen2_5_VLProcessor", "Qwen2VLProcessor"),
)
