r"""Ready-made task rewards: ``geo3k``, ``grounding``, ``text_visual``, each a composite of library components.

A recipe is its component list (``*_components``): exactly what ``reward.components`` takes in a config, so
``reward.function=geo3k`` and ``reward.components`` set to ``geo3k_components()`` score identically (tested). Each
returns ``{"score": total, <component>: value, ...}`` so every part is logged (``reward/<name>/mean``).

Gating: a gated term counts only when the format check passed. ``grounding`` gates IoU on format by default (a
box outside the requested ``<answer>`` tags earns nothing, so the policy cannot skip the format); ``geo3k`` keeps
verl's ungated sum by default so its reward curves match verl's, and ``gate=True`` turns gating on.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from vlmrl.scoring.composite import Composite, build_composite


def geo3k_components(format_score: float = 0.1, gate: bool = False) -> list[dict[str, Any]]:
    r"""verl's geo3k reward: ``(1 - format_score) * accuracy + format_score * format``.

    format: the response starts with ``<think>``, closes it, then has a ``\boxed{}`` (verl's regex). accuracy: the
    last ``\boxed{}`` equals the ground truth per math-verify (verl uses mathruler; math-verify accepts the same
    answers and more equivalent forms). ``gate=True`` counts accuracy only when the format is right.
    """
    return [
        {
            "name": "accuracy",
            "function": "math",
            "kwargs": {"boxed_only": True},
            "weight": 1.0 - format_score,
            "gate": "format" if gate else None,
            "gate_threshold": 1.0,
        },
        {"name": "format", "function": "format", "kwargs": {"style": "think_boxed"}, "weight": format_score},
    ]


def grounding_components(
    format_weight: float = 0.1,
    threshold: float | None = None,
    coords: str = "resized",
    style: str = "think_answer",
    gate: bool = True,
) -> list[dict[str, Any]]:
    """Box grounding: ``(1 - format_weight) * IoU + format_weight * format``, IoU gated on format by default.

    format: the response follows ``style`` (default ``<think>...</think><answer>...</answer>``) and its answer holds
    at least one well-formed box. IoU: the answer's boxes (``coords`` = resized, as Qwen2.5-VL writes them, or
    original) mapped to original pixels and matched one-to-one with the ground truth (extra boxes lower it);
    ``threshold`` turns it into a hit rate.
    """
    return [
        {
            "name": "iou",
            "function": "iou",
            "kwargs": {"threshold": threshold, "coords": coords},
            "weight": 1.0 - format_weight,
            "gate": "format" if gate else None,
            "gate_threshold": 1.0,
        },
        {
            "name": "format",
            "function": "box_format",
            "kwargs": {"style": style, "coords": coords},
            "weight": format_weight,
        },
    ]


def text_visual_components(text_weight: float = 0.7, mode: str = "f1", visual_mode: str = "f1") -> list[dict[str, Any]]:
    """``text_weight * similarity + (1 - text_weight) * visual_consistency`` (0.7 / 0.3 by default).

    similarity: ``mode`` (f1 | exact | rouge_l) of the answer against the reference text; visual consistency:
    the model-free check of named colours/shapes against ``extra_info["objects"]`` or the image.
    """
    return [
        {"name": "similarity", "function": "similarity", "kwargs": {"mode": mode}, "weight": text_weight},
        {
            "name": "visual",
            "function": "visual_consistency",
            "kwargs": {"mode": visual_mode},
            "weight": 1.0 - text_weight,
        },
    ]


@lru_cache(maxsize=64)
def _geo3k(format_score: float, gate: bool) -> Composite:
    return build_composite(geo3k_components(format_score, gate))


@lru_cache(maxsize=64)
def _grounding(format_weight: float, threshold: float | None, coords: str, style: str, gate: bool) -> Composite:
    return build_composite(grounding_components(format_weight, threshold, coords, style, gate))


@lru_cache(maxsize=64)
def _text_visual(text_weight: float, mode: str, visual_mode: str) -> Composite:
    return build_composite(text_visual_components(text_weight, mode, visual_mode))


def geo3k(sample: Any, *, format_score: float = 0.1, gate: bool = False) -> dict[str, float]:
    """The composite of :func:`geo3k_components`."""
    return _geo3k(format_score, gate)(sample)


def grounding(
    sample: Any,
    *,
    format_weight: float = 0.1,
    threshold: float | None = None,
    coords: str = "resized",
    style: str = "think_answer",
    gate: bool = True,
) -> dict[str, float]:
    """The composite of :func:`grounding_components`."""
    return _grounding(format_weight, threshold, coords, style, gate)(sample)


def text_visual(
    sample: Any, *, text_weight: float = 0.7, mode: str = "f1", visual_mode: str = "f1"
) -> dict[str, float]:
    """The composite of :func:`text_visual_components`."""
    return _text_visual(text_weight, mode, visual_mode)(sample)


geo3k.needs_images = False  # type: ignore[attr-defined]
grounding.needs_images = False  # type: ignore[attr-defined]
