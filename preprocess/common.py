"""Shared parts of the preprocess scripts: verl's record schema, image checks and encoding, record checks (the parallel
validate-and-build pipeline, its parquet output and report are in ``pipeline.py``).

Every script turns source rows into records of verl's schema::

    data_source: str
    prompt: [{role, content}]                  # one "<image>" per image (and "<video>" per video) in the text
    images: [{bytes, path}]                    # encoded bytes, source encoding kept (or paths with --store-paths)
    videos: [{frames: [{bytes, path}], ...}]   # only when the data has videos (``preprocess/video.py``)
    ability: str
    reward_model: {style: "rule", ground_truth: str}
    extra_info: {split, index, answer, question, ...}

A row that cannot become a valid record is rejected with one of ``REJECT_REASONS`` (``VIDEO_REJECT_REASONS`` for its
videos), written to ``rejects.jsonl`` beside the output and counted in the report; nothing is dropped silently.
``--strict`` stops at the first one.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vlmrl.data.records import PathOutside, resolve_inside

IMAGE_PLACEHOLDER = "<image>"
"""The image placeholder in prompt text (verl's convention); one per image."""

VIDEO_PLACEHOLDER = "<video>"
"""The video placeholder in prompt text (verl's convention); one per video."""

INSTRUCTION_FOLLOWING = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    r"The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)
"""verl's geo3k instruction, appended to the problem after one space."""

REJECT_REASONS: dict[str, str] = {
    "missing_field": "a required field (question, answer, images) is absent or null",
    "empty_question": "the question text is empty",
    "empty_answer": "the answer is empty",
    "unreadable_image": "an image file cannot be read (missing, permission, not a regular file, no bytes nor path)",
    "image_outside_dir": "an image path that leaves the folder images are read from (--image-dir, the input folder)",
    "image_file_too_large": "an image file over --max-image-bytes",
    "corrupt_image": "image bytes that Pillow cannot decode (unknown format, truncated)",
    "image_too_large": "Pillow's decompression-bomb guard refused the image (MAX_IMAGE_PIXELS)",
    "bad_aspect_ratio": "an image Qwen's resize cannot take at the training pixel bounds (--min-pixels/--max-pixels): "
    "a long/short side ratio over 200, or a side that shrinks below one patch",
    "image_count_mismatch": "the number of <image> placeholders differs from the number of images",
    "invalid_record": "the source row is not a record at all (bad JSON, text that is not UTF-8, wrong types)",
}
"""Every reason a source row can be rejected for, with what it means."""

VIDEO_REJECT_REASONS: dict[str, str] = {
    "unreadable_video": "a video file or frame folder cannot be read (missing, permission, not a regular file)",
    "video_outside_dir": "a video path that leaves the folder media are read from (--image-dir, the input folder)",
    "video_file_too_large": "a video file over --max-video-bytes",
    "corrupt_video": "a video FFmpeg cannot open or decode (not a video, an unknown container, truncated), or a frame "
    "Pillow cannot decode",
    "empty_video": "a video with no frames (an empty file, an empty frame folder)",
    "video_too_short": "fewer than 2 frames to sample (Qwen's vision tower takes frames in pairs)",
    "video_too_large": "frames over Pillow's decompression-bomb limit, or more frames than a video may have",
    "video_count_mismatch": "the number of <video> placeholders differs from the number of videos",
}
"""The reasons a row naming videos can be rejected for (besides ``REJECT_REASONS``), with what they mean."""

MAX_IMAGE_BYTES = 64 * 2**20
"""Default ``--max-image-bytes``: an image file larger than this is rejected without being read."""

DEFAULT_ROW_GROUP_SIZE = 100
"""Rows per parquet row group (``datasets`` uses 100 for image datasets): the dataset reads images a group at a time."""


class RecordError(Exception):
    """A source row that cannot become a record: ``reason`` is a key of ``REJECT_REASONS``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in REJECT_REASONS and reason not in VIDEO_REJECT_REASONS:
            raise ValueError(f"unknown reject reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def inside_root(path: str, root: str | os.PathLike, kind: str) -> Path:
    """The file a row's ``kind`` (image | video) path names inside ``root`` (``--image-dir``), or the reject:
    ``<kind>_outside_dir``, or ``unreadable_<kind>`` (a NUL byte, a symlink loop: ``vlmrl.data.records
    .resolve_inside``)."""
    try:
        return resolve_inside(path, root)
    except PathOutside:
        raise RecordError(f"{kind}_outside_dir", f"{path}: outside {Path(root).resolve()}") from None
    except ValueError as e:
        raise RecordError(f"unreadable_{kind}", str(e)) from None


class PreprocessError(RuntimeError):
    """A preprocessing run that must stop (``--strict`` hit a bad row, an unreadable input)."""


# ------------------------------------------------------------------------------------------------------ images


@dataclass(frozen=True)
class CheckedImage:
    """An image that decoded fully: its encoded bytes (when read), size and Pillow format."""

    data: bytes | None
    width: int
    height: int
    format: str | None


@dataclass(frozen=True)
class ImageRules:
    """How source images are read and checked (picklable: shipped to worker processes)."""

    root: str | None = None
    """Folder image paths must stay inside (None: rows may not name image files at all, only carry bytes)."""
    max_bytes: int = MAX_IMAGE_BYTES
    """Largest image file read."""
    min_pixels: int = 3136
    """Training's ``data.min_pixels`` (Qwen2.5-VL's default): the resize check uses the same bounds."""
    max_pixels: int = 12845056
    """Training's ``data.max_pixels`` (Qwen2.5-VL's default)."""


def read_image(path: str | os.PathLike, rules: ImageRules) -> bytes:
    """The bytes of an image file named by a source row: inside ``rules.root``, a regular file (a FIFO or a device is
    refused before it is opened), at most ``rules.max_bytes``. Raises ``RecordError``."""
    import stat

    if rules.root is None:
        raise RecordError("unreadable_image", f"{path}: this input's rows must carry image bytes, not file paths")
    full = inside_root(str(path), rules.root, "image")
    try:
        st = os.stat(full)
    except OSError as e:
        raise RecordError("unreadable_image", f"{path}: {type(e).__name__}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RecordError("unreadable_image", f"{path}: not a regular file")
    if st.st_size > rules.max_bytes:
        raise RecordError("image_file_too_large", f"{path}: {st.st_size} bytes (limit {rules.max_bytes})")
    try:
        with open(full, "rb") as f:
            return f.read(rules.max_bytes + 1)
    except OSError as e:
        raise RecordError("unreadable_image", f"{path}: {type(e).__name__}: {e.strerror or e}") from None


def check_image(
    data: bytes | None = None, path: str | os.PathLike | None = None, rules: ImageRules | None = None
) -> CheckedImage:
    """Decode an image completely (bytes preferred, else the file at ``path``, read by ``read_image``) and return its
    size and format; the resize check is the one training uses (``vlmrl.models.qwen_vl.resized_size``).

    Raises ``RecordError`` with reason unreadable_image, image_outside_dir, image_file_too_large, corrupt_image,
    image_too_large or bad_aspect_ratio. Pillow's decompression-bomb guard stays on."""
    from vlmrl.models.qwen_vl import resized_size

    rules = rules or ImageRules()
    if not data:  # None or empty: the file at path
        if path is None or str(path) == "":
            if data is not None:
                raise RecordError("corrupt_image", "empty image bytes (0 bytes) and no path")
            raise RecordError("unreadable_image", "image has neither bytes nor path")
        data = read_image(path, rules)
    where = f"{path}: " if path else ""
    if not data:
        raise RecordError("corrupt_image", f"{where}empty image (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.load()
            w, h = im.size
    except Image.DecompressionBombError as e:
        raise RecordError("image_too_large", f"{where}{e}") from None
    except Image.UnidentifiedImageError:  # its message names an in-memory buffer: say what the bytes are instead
        raise RecordError(
            "corrupt_image", f"{where}not an image Pillow can identify ({len(data)} bytes starting {data[:8]!r})"
        ) from None
    except (OSError, SyntaxError, ValueError) as e:  # truncated files, broken chunks, bad CRCs
        raise RecordError("corrupt_image", f"{where}{type(e).__name__}: {e}") from None
    try:
        resized_size(w, h, 28, rules.min_pixels, rules.max_pixels)
    except ValueError as e:
        raise RecordError("bad_aspect_ratio", f"{where}{e}") from None
    return CheckedImage(data, w, h, fmt)


def encode_pil(image: Image.Image, fmt: str = "PNG") -> bytes:
    """Encode a Pillow image (PNG by default, which is lossless and deterministic)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


_EXT = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "BMP": "bmp", "WEBP": "webp", "TIFF": "tiff"}


def image_struct(
    checked: CheckedImage,
    *,
    source_path: str | os.PathLike | None,
    source_name: str | None,
    store_paths: bool,
    output_dir: str | os.PathLike,
    spill_name: str,
) -> dict[str, Any]:
    """The ``{bytes, path}`` struct stored for one image.

    By default the encoded bytes are stored as they came (no re-encoding) with ``source_name`` as the informative path.
    With ``store_paths`` only a path is stored, relative to ``output_dir``: the dataset reads paths only inside the
    parquet file's folder, so a source file inside ``output_dir`` is referred to where it is, and any other image is
    written to ``output_dir/images/<spill_name>.<ext>`` (hard-linked from its source when the file system allows)."""
    if not store_paths:
        return {"bytes": checked.data, "path": source_name}
    out = Path(output_dir).resolve()
    src = Path(source_path).resolve() if source_path is not None and Path(source_path).is_file() else None
    if src is not None and src.is_relative_to(out):
        target = src
    else:
        target = out / "images" / f"{spill_name}.{_EXT.get(checked.format or '', 'img')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            if src is None:
                raise OSError("no source file")
            os.link(src, target)
        except OSError:
            target.write_bytes(checked.data or b"")
    return {"bytes": None, "path": os.path.relpath(target, out)}


# ----------------------------------------------------------------------------------------------------- records


def count_placeholders(text: str) -> int:
    """Number of ``<image>`` placeholders in a text."""
    return text.count(IMAGE_PLACEHOLDER)


def require_text(value: Any, name: str, empty_reason: str) -> str:
    """A required string field: missing_field when absent/null, ``empty_reason`` when blank, invalid_record if not
    a string."""
    if value is None:
        raise RecordError("missing_field", f"{name} is missing")
    if not isinstance(value, str):
        raise RecordError("invalid_record", f"{name} is {type(value).__name__}, expected a string")
    if not value.strip():
        raise RecordError(empty_reason, f"{name} is empty")
    check_utf8(value, name)
    return value


def check_placeholders(question: str, num_images: int, num_videos: int = 0) -> None:
    """Raise image_count_mismatch unless the question holds one ``<image>`` per image (video_count_mismatch: one
    ``<video>`` per video)."""
    n = count_placeholders(question)
    if n != num_images:
        raise RecordError("image_count_mismatch", f"{n} {IMAGE_PLACEHOLDER} placeholder(s) for {num_images} image(s)")
    v = question.count(VIDEO_PLACEHOLDER)
    if v != num_videos:
        raise RecordError("video_count_mismatch", f"{v} {VIDEO_PLACEHOLDER} placeholder(s) for {num_videos} video(s)")


def build_record(
    *,
    data_source: str,
    question: str,
    answer: str,
    images: list[dict[str, Any]],
    split: str,
    index: int,
    ability: str,
    instruction: str | None = None,
    extra_info: dict[str, Any] | None = None,
    videos: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One record in verl's schema (the same structure verl's geo3k script writes).

    The prompt is a single user message: ``question`` followed by one space and ``instruction`` when given.
    ``videos`` (video structs, ``video.video_struct``) adds the ``videos`` column; leave it None for data without
    videos."""
    content = question if not instruction else f"{question} {instruction}"
    info = {"split": split, "index": index, "answer": answer, "question": question}
    info.update(extra_info or {})
    record = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "images": images,
        **({"videos": videos} if videos is not None else {}),
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": info,
    }
    check_utf8(record)
    return record


def check_utf8(value: Any, name: str = "record") -> None:
    """Raise invalid_record when a string anywhere in ``value`` cannot be written as UTF-8 (a lone surrogate such as
    JSON's ``"\\udcff"``): parquet would refuse it when the row group is written, failing the whole run."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = value[e.start : e.end].encode("utf-8", "backslashreplace").decode("ascii")
            raise RecordError(
                "invalid_record", f"{name} is not valid UTF-8 text ({bad} at character {e.start})"
            ) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            check_utf8(v, f"{name}.{k}")
    elif isinstance(value, (list, tuple)):
        for k, v in enumerate(value):
            check_utf8(v, f"{name}[{k}]")


def record_features(extra_info: dict[str, Any] | None = None, videos: bool = False) -> Any:
    """``datasets.Features`` of the record schema (``extra_info``: extra fields beyond split/index/answer/question;
    ``videos``: add the ``videos`` column).

    Its arrow schema carries the ``huggingface`` metadata, so ``datasets`` reads ``images`` as a list of ``Image``
    exactly as it reads verl's output (and each video's ``frames`` the same way)."""
    import datasets

    v = datasets.Value
    info = {"split": v("string"), "index": v("int64"), "answer": v("string"), "question": v("string")}
    info.update(extra_info or {})
    columns: dict[str, Any] = {
        "data_source": v("string"),
        "prompt": datasets.List({"role": v("string"), "content": v("string")}),
        "images": datasets.List(datasets.Image()),
    }
    if videos:
        columns["videos"] = datasets.List(
            {
                "frames": datasets.List(datasets.Image()),
                "video": v("string"),
                "video_fps": v("float64"),
                "sample_fps": v("float64"),
                "total_num_frames": v("int64"),
                "frames_indices": datasets.List(v("int64")),
                "timestamps": datasets.List(v("float64")),
            }
        )
    columns.update(
        {
            "ability": v("string"),
            "reward_model": {"style": v("string"), "ground_truth": v("string")},
            "extra_info": info,
        }
    )
    return datasets.Features(columns)


def isfinite_number(x: Any) -> bool:
    """True for an int/float that is finite (used to validate box coordinates)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
