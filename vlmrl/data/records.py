"""Turning one parquet record into a chat and images: ``<image>`` placeholders → image content parts, image structs →
decoded RGB images (or only their header size), and the error every bad record raises (``DataError``)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
"""The image placeholder in prompt text; one per image of the record."""


class DataError(ValueError):
    """A record the dataset cannot use. The message names the file and the row."""


def where(file: str | os.PathLike, row: int) -> str:
    """``<file> row <n>``: how errors name a record."""
    return f"{file} row {row}"


# ------------------------------------------------------------------------------------------------------- chats


def split_placeholders(text: str) -> list[dict[str, Any]]:
    """``"<image>What is x?"`` → ``[{"type": "image"}, {"type": "text", "text": "What is x?"}]`` (empty text parts
    between placeholders are dropped)."""
    parts: list[dict[str, Any]] = []
    for k, chunk in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if k > 0:
            parts.append({"type": "image"})
        if chunk:
            parts.append({"type": "text", "text": chunk})
    return parts


def _content_parts(content: Any) -> tuple[Any, int]:
    """A message's content with placeholders turned into image parts, and how many images it refers to."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        n = content.count(IMAGE_PLACEHOLDER)
        return (split_placeholders(content), n) if n else (content, 0)
    if isinstance(content, (list, tuple)):  # already structured: split placeholders inside its text parts
        out: list[dict[str, Any]] = []
        n = 0
        for part in content:
            if not isinstance(part, dict):
                raise TypeError(f"content part is {type(part).__name__}, expected a dict")
            kind = part.get("type")
            if kind == "text" or (kind is None and "text" in part):
                sub = split_placeholders(part.get("text") or "")
                n += sum(1 for p in sub if p["type"] == "image")
                out.extend(sub)
            elif kind == "image" or "image" in part or "image_url" in part:
                out.append({"type": "image"})
                n += 1
            else:
                out.append({k: v for k, v in part.items() if v is not None})
        return out, n
    raise TypeError(f"message content is {type(content).__name__}, expected a string or a list of parts")


def build_messages(prompt: Any, system_prompt: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The chat of a record's prompt column, and the number of images it refers to.

    ``prompt`` is verl's ``[{role, content}]`` list (or a bare string, taken as one user message). ``<image>`` in a
    content string becomes a ``{"type": "image"}`` part with the text split around it; messages without images keep
    a string content. ``system_prompt`` is prepended when set and the chat has no system message."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise TypeError(f"prompt is {type(prompt).__name__}, expected a non-empty list of {{role, content}}")
    messages: list[dict[str, Any]] = []
    n_images = 0
    for m in prompt:
        if not isinstance(m, dict) or "role" not in m:
            raise TypeError(f"prompt message {m!r:.80} has no role")
        content, n = _content_parts(m.get("content"))
        n_images += n
        messages.append({"role": m["role"], "content": content})
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages, n_images


# ------------------------------------------------------------------------------------------------------ images


def image_entries(value: Any) -> list[Any]:
    """The list of image entries of a record's image column (None → [])."""
    if value is None:
        return []
    if isinstance(value, (dict, str, bytes)):
        return [value]
    return list(value)


def _source(entry: Any, base_dir: str | os.PathLike) -> tuple[bytes | None, Path | None]:
    """(bytes, resolved path) of an image entry: a ``{bytes, path}`` struct, a path string or raw bytes.
    Bytes win over the path; a relative path is resolved against ``base_dir`` (the parquet file's folder)."""
    data: Any = None
    path: Any = None
    if isinstance(entry, dict):
        data, path = entry.get("bytes"), entry.get("path")
    elif isinstance(entry, (bytes, bytearray, memoryview)):
        data = entry
    elif isinstance(entry, (str, os.PathLike)):
        path = entry
    else:
        raise DataError(f"image entry is {type(entry).__name__}, expected {{bytes, path}}")
    if data:
        return bytes(data), None
    if path:
        p = Path(str(path).removeprefix("file://")).expanduser()
        return None, p if p.is_absolute() else Path(base_dir) / p
    raise DataError("image entry has neither bytes nor path")


def _open(entry: Any, base_dir: str | os.PathLike) -> Image.Image:
    data, path = _source(entry, base_dir)
    try:
        return Image.open(io.BytesIO(data)) if data is not None else Image.open(path)
    except Image.DecompressionBombError as e:
        raise DataError(f"image refused by Pillow's decompression-bomb guard: {e}") from None
    except FileNotFoundError:
        raise DataError(f"image file not found: {path}") from None
    except OSError as e:  # UnidentifiedImageError, permission...
        raise DataError(f"image cannot be read ({type(e).__name__}: {e})") from None


def image_size(entry: Any, base_dir: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from the image's header only (no pixel decoding)."""
    with _open(entry, base_dir) as im:
        return im.size


def decode_image(entry: Any, base_dir: str | os.PathLike) -> Image.Image:
    """Decode an image entry fully (RGB conversion and resizing are the caller's: ``qwen_vl.resize_image``)."""
    im = _open(entry, base_dir)
    try:
        im.load()
    except Image.DecompressionBombError as e:
        raise DataError(f"image refused by Pillow's decompression-bomb guard: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"image cannot be decoded ({type(e).__name__}: {e})") from None
    return im
