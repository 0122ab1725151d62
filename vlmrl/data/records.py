"""Turning one parquet record into a chat and images: ``<image>`` / ``<video>`` placeholders → image / video content
parts, image structs → decoded RGB images (or only their header size), and the error every bad record raises
(``DataError``). Video entries are read in ``data.video``."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
"""The image placeholder in prompt text; one per image of the record."""

VIDEO_PLACEHOLDER = "<video>"
"""The video placeholder in prompt text (verl's); one per video of the record."""

_PLACEHOLDERS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")

MAX_IMAGE_FILE_BYTES = 256 * 2**20
"""An image file larger than this is refused (256 MiB: far above any real image; a guard against ``/dev/zero``-like
paths and runaway files)."""


class DataError(ValueError):
    """A record the dataset cannot use. The message names the file and the row."""


def where(file: str | os.PathLike, row: int) -> str:
    """``<file> row <n>``: how errors name a record."""
    return f"{file} row {row}"


# ------------------------------------------------------------------------------------------------------- chats


def split_placeholders(text: str) -> list[dict[str, Any]]:
    """``"<image>What is x?"`` → ``[{"type": "image"}, {"type": "text", "text": "What is x?"}]``; ``<video>`` becomes
    ``{"type": "video"}`` (empty text parts between placeholders are dropped)."""
    parts: list[dict[str, Any]] = []
    for chunk in _PLACEHOLDERS.split(text):
        if chunk == IMAGE_PLACEHOLDER:
            parts.append({"type": "image"})
        elif chunk == VIDEO_PLACEHOLDER:
            parts.append({"type": "video"})
        elif chunk:
            parts.append({"type": "text", "text": chunk})
    return parts


def _content_parts(content: Any) -> tuple[Any, int]:
    """A message's content with placeholders turned into image and video parts, and how many images it refers to."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        if not _PLACEHOLDERS.search(content):
            return content, 0
        parts = split_placeholders(content)
        return parts, sum(1 for p in parts if p["type"] == "image")
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
            elif kind == "video" or "video" in part:
                out.append({"type": "video"})
            else:
                out.append({k: v for k, v in part.items() if v is not None})
        return out, n
    raise TypeError(f"message content is {type(content).__name__}, expected a string or a list of parts")


def count_videos(messages: list[dict[str, Any]]) -> int:
    """Video parts in a chat built by ``build_messages`` (one per ``<video>`` placeholder)."""
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") == "video"
    )


def build_messages(prompt: Any, system_prompt: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The chat of a record's prompt column, and the number of images it refers to.

    ``prompt`` is verl's ``[{role, content}]`` list (or a bare string, taken as one user message). ``<image>`` in a
    content string becomes a ``{"type": "image"}`` part with the text split around it (``<video>`` a ``{"type":
    "video"}`` part: ``count_videos`` counts them); messages without either keep a string content. ``system_prompt``
    is prepended when set and the chat has no system message."""
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
    """The list of image entries of a record's image column (None → []); ``DataError`` for a value that is not
    images at all (a number, a bool)."""
    if value is None:
        return []
    if isinstance(value, (dict, str, bytes)):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise DataError(f"image column value is {type(value).__name__}, expected a list of {{bytes, path}} structs")


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
    if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
        raise DataError(f"image entry's bytes are {type(data).__name__}, expected bytes")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise DataError(f"image entry's path is {type(path).__name__}, expected a string")
    if data:
        return bytes(data), None
    if path:
        return None, confined_path(str(path), base_dir)
    if data is not None:
        raise DataError("image is empty (0 bytes) and has no path")
    raise DataError("image entry has neither bytes nor path")


class PathOutside(ValueError):
    """A path that leaves the folder it must stay in (``resolve_inside``)."""


def resolve_inside(path: str, base_dir: str | os.PathLike) -> Path:
    """``path`` resolved against ``base_dir`` (``file://`` and ``~`` allowed), or ValueError saying why it cannot be:
    a NUL byte (the OS cannot take it), a symlink loop or a name too long, or ``PathOutside`` when it leaves
    ``base_dir`` (``../``, an absolute path elsewhere, a symlink out of it). The one check training and preprocessing
    share for every media path a row names."""
    if "\x00" in path:
        raise ValueError(f"{path!r}: the path contains a NUL byte")
    base = Path(base_dir).resolve()
    p = Path(path.removeprefix("file://")).expanduser()
    try:
        full = (p if p.is_absolute() else base / p).resolve()
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13), a name too long
        raise ValueError(f"{path!r} cannot be resolved ({type(e).__name__}: {e})") from None
    if not full.is_relative_to(base):
        raise PathOutside(f"{path!r} leaves {base}")
    return full


def confined_path(path: str, base_dir: str | os.PathLike, kind: str = "image") -> Path:
    """The file an image (or video: ``kind``) path names inside ``base_dir`` (the parquet file's folder), or
    ``DataError`` (``resolve_inside``: a dataset may only name files inside its folder)."""
    try:
        return resolve_inside(path, base_dir)
    except PathOutside:
        raise DataError(
            f"{kind} path {path!r} leaves the data folder {Path(base_dir).resolve()} (a dataset may only "
            "name files inside it)"
        ) from None
    except ValueError as e:
        raise DataError(f"{kind} path {e}") from None


def read_image_file(path: Path) -> bytes:
    """The bytes of a regular image file of at most ``MAX_IMAGE_FILE_BYTES`` (a FIFO, a device or a folder is refused
    before it is opened, so nothing blocks or fills memory)."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DataError(f"image file not found: {path}") from None
    except OSError as e:
        raise DataError(f"image cannot be read ({type(e).__name__}: {e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"image path is not a regular file: {path}")
    if st.st_size > MAX_IMAGE_FILE_BYTES:
        raise DataError(f"image file is {st.st_size} bytes, over the {MAX_IMAGE_FILE_BYTES}-byte limit: {path}")
    if st.st_size == 0:
        raise DataError(f"image file is empty (0 bytes): {path}")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_IMAGE_FILE_BYTES + 1)
    except OSError as e:
        raise DataError(f"image cannot be read ({type(e).__name__}: {e})") from None


def _open(entry: Any, base_dir: str | os.PathLike) -> Image.Image:
    data, path = _source(entry, base_dir)
    if data is None and path is not None:
        data = read_image_file(path)
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise DataError(f"image refused by Pillow's decompression-bomb guard: {e}") from None
    except Image.UnidentifiedImageError:  # its message names an in-memory buffer: say what the bytes are instead
        what = f"{len(data)} bytes starting {data[:8]!r}" + (f" from {path}" if path is not None else "")
        raise DataError(f"image cannot be read (not an image Pillow can identify: {what})") from None
    except OSError as e:  # permission, a folder...
        raise DataError(f"image cannot be read ({type(e).__name__}: {e})") from None


def image_size(entry: Any, base_dir: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from the image's header only (no pixel decoding)."""
    with _open(entry, base_dir) as im:
        return im.size


_HIGH_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def to_rgb(im: Image.Image) -> Image.Image:
    """An 8-bit RGB image of any Pillow mode.

    16-bit, 32-bit and float greyscale are scaled to 8 bits (``convert`` would clip them: a 16-bit image turns
    white); transparency (RGBA, LA, PA, a palette or tRNS colour) is composited over white, as qwen-vl-utils does
    for RGBA; CMYK, YCbCr, palette and bilevel images are converted. An RGB image is returned as is."""
    if im.mode == "RGB":
        return im
    if im.mode in _HIGH_DEPTH_MODES:
        arr = np.asarray(im, dtype=np.float64)
        top = float(arr.max()) if arr.size else 0.0
        if top > 255:
            arr = arr * (255.0 / (65535.0 if top <= 65535 else top))
        grey = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8))
        return grey.convert("RGB")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        out = Image.new("RGB", im.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return im.convert("RGB")


def decode_image(entry: Any, base_dir: str | os.PathLike) -> Image.Image:
    """Decode an image entry fully into 8-bit RGB (``to_rgb``); resizing is the caller's (``qwen_vl.resize_image``)."""
    im = _open(entry, base_dir)
    try:
        im.load()
        rgb = to_rgb(im)
    except Image.DecompressionBombError as e:
        im.close()
        raise DataError(f"image refused by Pillow's decompression-bomb guard: {e}") from None
    except (OSError, SyntaxError, ValueError) as e:
        im.close()
        raise DataError(f"image cannot be decoded ({type(e).__name__}: {e})") from None
    if rgb is not im:
        im.close()
    return rgb


# ------------------------------------------------------------------------------------------------------ answers


def ground_truth_problem(reward: Any) -> str | None:
    """Why a record's ``reward_model`` value cannot score it, or None when it can.

    A rule-scored record (``style`` "rule" or absent) needs a non-empty ``ground_truth``: without one every response
    scores the same and the record silently teaches nothing. A model-scored one (another ``style``) needs none."""
    if reward is None:
        return "reward_model is missing (null)"
    if not isinstance(reward, dict):
        return f"reward_model is {type(reward).__name__}, expected {{style, ground_truth}}"
    if reward.get("style") not in (None, "rule"):
        return None
    truth = reward.get("ground_truth")
    if truth is None:
        return "reward_model.ground_truth (the answer) is missing"
    if (isinstance(truth, str) and not truth.strip()) or (isinstance(truth, (list, tuple, dict)) and not truth):
        return "reward_model.ground_truth (the answer) is empty"
    return None
