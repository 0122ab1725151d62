"""Qwen3-VL-MoE (30B-A3B, 235B-A22B): Qwen3-VL's vision side and prompt layout, a mixture-of-experts language model.
vlmrl trains it with FSDP like a dense model (every expert on every rank); expert parallelism and routing replay
(verl's Megatron options) and the router's auxiliary load-balancing loss are not implemented."""

from dataclasses import replace

from vlmrl.models.families.qwen3_vl import QWEN3_VL

QWEN3_VL_MOE = replace(
    QWEN3_VL,
    name="qwen3_vl_moe",
    label="Qwen3-VL-MoE",
    model_types=("qwen3_vl_moe",),
    processor_classes=(),  # Qwen3VLProcessor: the dense family's prompt layout
    moe=True,
    moe_not_implemented=("expert parallelism", "routing replay", "the router's load-balancing loss"),
    fused_experts=("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
)
