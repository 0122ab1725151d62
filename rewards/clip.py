"""Image-text agreement from a CLIP-style model (CLIP, SigLIP...) loaded with transformers from a LOCAL folder.

The score is CLIPScore (Hessel et al., 2021): ``min(1, w * max(cos(image, text), 0))`` with ``w = 2.5``, between
the image the model saw and the response's answer span (``<answer>``, ``\\boxed{}``, else the text after
``</think>``), truncated to the text encoder's length. The model loads once per process (cached by path) and image
embeddings are cached by image content, so the n samples of one prompt embed their image once.

Registry name ``clip_consistency``; ``model_path`` is required (a folder written by ``save_pretrained``; nothing is
downloaded). Run it with ``reward.num_workers >= 1`` for big models so the driver stays light.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from vlmrl.rewards.format import answer_span

_MODELS: dict[tuple[str, str], tuple[Any, Any]] = {}
_IMAGE_CACHE: OrderedDict[tuple[str, str], Any] = OrderedDict()
_IMAGE_CACHE_SIZE = 256


def load_clip(model_path: str, device: str = "cpu") -> tuple[Any, Any]:
    """(model, processor) from a local folder, cached per process; eval mode, no gradients."""
    key = (str(model_path), device)
    if key not in _MODELS:
        import torch
        from transformers import AutoModel, AutoProcessor

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModel.from_pretrained(model_path, local_files_only=True).to(device).eval()
        processor = AutoProcessor.from_pretrained(model_path, local_files_only=True)
        _MODELS[key] = (model, processor)
    return _MODELS[key]


def _features(out: Any) -> Any:
    # transformers 5 returns a model output whose pooler_output is the projected embedding; 4.x returned the tensor
    return out if hasattr(out, "norm") else out.pooler_output


def _max_text_len(model: Any) -> int:
    text_cfg = getattr(model.config, "text_config", model.config)
    return int(getattr(text_cfg, "max_position_embeddings", 77))


def image_embedding(model: Any, processor: Any, image: Any, model_path: str) -> Any:
    """L2-normalised embedding of one PIL image (cached by the image's bytes)."""
    import torch

    rgb = image.convert("RGB")
    key = (model_path, hashlib.blake2b(rgb.tobytes(), digest_size=16).hexdigest() + f"{rgb.size}")
    hit = _IMAGE_CACHE.get(key)
    if hit is not None:
        _IMAGE_CACHE.move_to_end(key)
        return hit
    device = next(model.parameters()).device
    with torch.no_grad():
        pixels = processor(images=[rgb], return_tensors="pt")["pixel_values"].to(device)
        emb = _features(model.get_image_features(pixel_values=pixels))[0].float()
    emb = emb / emb.norm().clamp_min(1e-12)
    _IMAGE_CACHE[key] = emb
    if len(_IMAGE_CACHE) > _IMAGE_CACHE_SIZE:
        _IMAGE_CACHE.popitem(last=False)
    return emb


def text_embedding(model: Any, processor: Any, text: str) -> Any:
    """L2-normalised embedding of a text, truncated to the text encoder's length."""
    import torch

    tok = getattr(processor, "tokenizer", processor)
    device = next(model.parameters()).device
    enc = tok([text], truncation=True, max_length=_max_text_len(model), padding=True, return_tensors="pt")
    enc = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        emb = _features(model.get_text_features(**enc))[0].float()
    return emb / emb.norm().clamp_min(1e-12)


def clip_score(cosine: float, weight: float = 2.5) -> float:
    """CLIPScore in [0, 1]: ``min(1, weight * max(cosine, 0))``."""
    return float(min(1.0, weight * max(cosine, 0.0)))


def clip_consistency(
    sample: Any, *, model_path: str, device: str = "cpu", weight: float = 2.5, image_index: int = 0
) -> float:
    """CLIPScore between image ``image_index`` and the response's answer span; 0 for an empty answer."""
    images = list(getattr(sample, "images", None) or [])
    if image_index >= len(images):
        raise ValueError(f"clip_consistency: sample has {len(images)} images, needs index {image_index}")
    text = answer_span(sample.response)[:2000].strip()
    if not text:
        return 0.0
    model, processor = load_clip(model_path, device)
    img = image_embedding(model, processor, images[image_index], str(model_path))
    txt = text_embedding(model, processor, text)
    return clip_score(float((img * txt).sum()), weight)
