"""Videos of a record: the entries of the ``videos`` column, how they are measured, decoded and sampled.

An entry is one of
- vlmrl's struct (``preprocess/`` writes it): ``frames`` (the sampled frames as ``{bytes, path}`` structs, the way
  images are stored) or ``video`` (a video file, relative to the parquet file's folder), with the sampling it
  recorded: ``video_fps`` (the source's frame rate), ``frames_indices``, ``total_num_frames``, ``timestamps``
  (seconds) and ``sample_fps`` (frames per second of the sampled frames);
- verl's (qwen-vl-utils') dict: ``{"video": "clip.mp4" | [frame paths], "fps": 2, "nframes"/"min_frames"/
  "max_frames", "max_pixels", "total_pixels", ...}``: a file is sampled here by those keys (else ``data.video_*``).

Video files are decoded with PyAV (FFmpeg) and only when they are regular files inside the data folder, under a size
cap, in a container format from ``VIDEO_FORMATS`` (no playlist or concat demuxer that would open other files) with the
``file`` protocol only; frames larger than Pillow's decompression-bomb limit and videos longer than
``MAX_VIDEO_FRAMES`` frames are refused. Frame images are read like images (``records.decode_image``).

Frames are resized as they are decoded (``decode_frames``' ``size``, ``load_video``'s ``fit``), so memory holds at
most one frame at the source's size: a 4K clip's 768 sampled frames would take about 19 GB kept at full size.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmrl.batch import Video
from vlmrl.data.records import DataError, confined_path, decode_image, image_size
from vlmrl.models import qwen_vl
from vlmrl.models.qwen_vl import (
    FRAME_FACTOR,
    FrameSampling,
    num_video_tokens,
    resize_frames,
    sample_frame_indices,
    video_frame_size,
)

MAX_VIDEO_FILE_BYTES = 2 * 2**30
"""A video file larger than this is refused (2 GiB)."""

MAX_VIDEO_FRAMES = 100_000
"""A video with more frames than this is refused (about an hour at 30 fps): decoding it would take minutes."""

VIDEO_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,mpeg,mpegts,flv,gif,ogg"
"""Container formats (FFmpeg demuxers) a video file may be in."""

DEFAULT_FRAME_LIST_FPS = 2.0
"""Frames per second assumed for a list of frames that records none (qwen-vl-utils' ``sample_fps`` default)."""

_SAMPLING_KEYS = ("fps", "nframes", "min_frames", "max_frames")
_PIXEL_KEYS = ("min_pixels", "max_pixels", "total_pixels")
_UNSUPPORTED_KEYS = ("video_start", "video_end", "resized_height", "resized_width")


class VideoError(DataError):
    """A video that cannot be used; ``reason`` names the kind (preprocessing's reject reasons)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class VideoEntry:
    """One entry of a record's video column, normalised."""

    frames: list[Any] = field(default_factory=list)
    """Frame images (``{bytes, path}`` structs, bytes or paths), in order; empty when ``file`` is set."""
    file: str | None = None
    """A video file to decode."""
    fps: float | None = None
    """Frame rate of the source (``video_fps``; else a file's average rate). An entry's own ``fps`` is
    qwen-vl-utils' sampling rate (``sampling``)."""
    frames_indices: list[int] | None = None
    """The source frames that were sampled (recorded by preprocessing); None = sample now."""
    total_num_frames: int | None = None
    """Frames of the source."""
    timestamps: list[float] | None = None
    """Seconds of each sampled frame in the source."""
    sample_fps: float | None = None
    """Frames per second of the sampled frames."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """qwen-vl-utils sampling keys of a verl entry (``fps``, ``nframes``, ``min_frames``, ``max_frames``)."""
    pixels: dict[str, int] = field(default_factory=dict)
    """qwen-vl-utils pixel keys of a verl entry (``min_pixels``, ``max_pixels``, ``total_pixels``)."""


@dataclass
class RawVideo:
    """A video's sampled frames, decoded (resized when ``load_video`` was given a ``fit``)."""

    frames: list[Image.Image]
    timestamps: list[float]
    sample_fps: float
    source_size: tuple[int, int] | None = None
    """(width, height) of the first frame as decoded, before any resizing."""


FrameSize = tuple[int, int] | Callable[[int, int], tuple[int, int]] | None
"""What ``decode_frames`` resizes frames to: a (width, height); a function of the source (width, height) of the first
sampled frame giving it; or None (the source size)."""


def video_entries(value: Any) -> list[VideoEntry]:
    """The videos of a record's video column value (None → []); ``DataError`` for a value that is not videos."""
    if value is None:
        return []
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise DataError(f"video column value is {type(value).__name__}, expected a list of videos")
    return [parse_entry(v, k) for k, v in enumerate(value)]


def _number(value: Any, name: str, k: int, integer: bool = False) -> Any:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (integer and int(value) != value):
        raise DataError(f"video {k}: {name}={value!r} is not a positive {'integer' if integer else 'number'}")
    return int(value) if integer else float(value)


def parse_entry(entry: Any, k: int = 0) -> VideoEntry:
    """One video entry (vlmrl's struct, verl's dict, a file path or a list of frames) → ``VideoEntry``."""
    if isinstance(entry, str):
        return VideoEntry(file=entry)
    if isinstance(entry, (list, tuple)):
        return VideoEntry(frames=list(entry))
    if not isinstance(entry, dict):
        raise DataError(f"video {k} is {type(entry).__name__}, expected a {{frames | video, ...}} struct")
    bad = [key for key in _UNSUPPORTED_KEYS if entry.get(key) is not None]
    if bad:
        raise DataError(f"video {k}: {', '.join(bad)} not supported (cut the clip when preprocessing)")
    frames = entry.get("frames")
    video = entry.get("video")
    if isinstance(video, (list, tuple)):  # verl's list of frames
        frames, video = (list(frames or []) + list(video)), None
    if frames and video:
        raise DataError(f"video {k} has both frames and a video file; keep one")
    if video is not None and not isinstance(video, str):
        raise DataError(f"video {k}: 'video' is {type(video).__name__}, expected a path")
    if not frames and not video:
        raise DataError(f"video {k} has no frames and no video file")
    indices = entry.get("frames_indices")
    stamps = entry.get("timestamps")
    out = VideoEntry(
        frames=list(frames or []),
        file=video or None,
        fps=_number(entry.get("video_fps"), "video_fps", k),
        frames_indices=None if indices is None else [int(i) for i in indices],
        total_num_frames=_number(entry.get("total_num_frames"), "total_num_frames", k, integer=True),
        timestamps=None if stamps is None else [float(t) for t in stamps],
        sample_fps=_number(entry.get("sample_fps"), "sample_fps", k),
    )
    if indices is None:  # not sampled yet (verl's entries): its own sampling keys, if any
        for key in _SAMPLING_KEYS:
            if entry.get(key) is not None:
                out.sampling[key] = _number(entry[key], key, k, integer=key != "fps")
    for key in _PIXEL_KEYS:
        if entry.get(key) is not None:
            out.pixels[key] = _number(entry[key], key, k, integer=True)
    n = len(out.frames_indices) if out.frames_indices is not None else len(out.frames)
    if out.timestamps is not None and n and len(out.timestamps) != n:
        raise DataError(f"video {k}: {len(out.timestamps)} timestamps for {n} frames")
    if out.frames and out.frames_indices is not None and len(out.frames_indices) != len(out.frames):
        raise DataError(f"video {k}: {len(out.frames_indices)} frames_indices for {len(out.frames)} frames")
    return out


def sampling_of(entry: VideoEntry, default: FrameSampling) -> FrameSampling:
    """The frame sampling a not-yet-sampled file entry asks for: its own keys over ``default``."""
    s = entry.sampling
    if "nframes" in s and "fps" in s:
        raise DataError("a video entry may set nframes or fps, not both")
    return FrameSampling(
        fps=s.get("fps", default.fps),
        min_frames=s.get("min_frames", default.min_frames),
        max_frames=s.get("max_frames", default.max_frames),
        nframes=s.get("nframes", None if "fps" in s else default.nframes),
    )


# -------------------------------------------------------------------------------------------------- video files


def check_video_file(path: Path, max_bytes: int = MAX_VIDEO_FILE_BYTES) -> None:
    """``VideoError`` unless ``path`` is a regular, non-empty file of at most ``max_bytes``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise VideoError("unreadable_video", f"video file not found: {path}") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise VideoError("unreadable_video", f"video cannot be read ({type(e).__name__}: {e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise VideoError("unreadable_video", f"video path is not a regular file: {path}")
    if st.st_size > max_bytes:
        raise VideoError(
            "video_file_too_large", f"video file is {st.st_size} bytes, over the {max_bytes}-byte limit: {path}"
        )
    if st.st_size == 0:
        raise VideoError("empty_video", f"video file is empty (0 bytes): {path}")


def _open_container(path: Path) -> Any:
    import av

    try:
        return av.open(str(path), options={"format_whitelist": VIDEO_FORMATS, "protocol_whitelist": "file"})
    except av.error.ArgumentError:
        raise VideoError("corrupt_video", f"{path}: not a video in a container format of {VIDEO_FORMATS}") from None
    except (av.error.FFmpegError, OSError) as e:
        raise VideoError("corrupt_video", f"{path}: cannot be opened as a video ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class VideoInfo:
    """What a video file's header says."""

    total_frames: int
    fps: float
    width: int
    height: int


def _stream(container: Any, path: Path) -> Any:
    if not container.streams.video:
        raise VideoError("corrupt_video", f"{path}: no video stream")
    st = container.streams.video[0]
    w, h = int(st.codec_context.width or 0), int(st.codec_context.height or 0)
    if w < 1 or h < 1:
        raise VideoError("corrupt_video", f"{path}: the video stream has no frame size")
    if Image.MAX_IMAGE_PIXELS and w * h > Image.MAX_IMAGE_PIXELS:
        raise VideoError("video_too_large", f"{path}: {w}x{h} frames, over Pillow's decompression-bomb limit")
    return st


def probe_video(path: Path) -> VideoInfo:
    """Frame count, frame rate and frame size of a video file (a file whose header has no frame count is counted by
    decoding it)."""
    import av

    with _open_container(path) as c:
        st = _stream(c, path)
        rate = float(st.average_rate or st.guessed_rate or 0)
        n = int(st.frames or 0)
        w, h = int(st.codec_context.width), int(st.codec_context.height)
        if n <= 0:
            try:
                for _ in c.decode(st):
                    n += 1
                    if n > MAX_VIDEO_FRAMES:
                        break
            except (av.error.FFmpegError, OSError) as e:
                raise VideoError("corrupt_video", f"{path}: cannot be decoded ({type(e).__name__}: {e})") from None
    if n == 0:
        raise VideoError("empty_video", f"{path}: the video has no frames")
    if n > MAX_VIDEO_FRAMES:
        raise VideoError("video_too_large", f"{path}: more than {MAX_VIDEO_FRAMES} frames")
    if not rate or not math.isfinite(rate):
        raise VideoError("corrupt_video", f"{path}: the video has no frame rate")
    return VideoInfo(n, rate, w, h)


def fit_frame(image: Image.Image, size: tuple[int, int] | None) -> Image.Image:
    """An RGB frame at ``size`` (None: as it is), resized exactly as ``qwen_vl.resize_frames`` does (bicubic)."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    if size is None or image.size == size:
        return image
    return image.resize(size, Image.Resampling.BICUBIC)


def decode_frames(path: Path, indices: list[int], size: FrameSize = None, *, keep: bool = True) -> list[Image.Image]:
    """The frames at ``indices`` (in that order, repeats allowed) of a video file, as RGB images; ``VideoError`` when
    the file ends before the last one.

    ``size`` (``FrameSize``) resizes each frame as soon as it is decoded (``fit_frame``: the pixels resizing the
    source-size frames afterwards gives), so memory holds one source-size frame at a time (frames decoded before the
    one at ``indices[0]``, when ``indices`` is not ascending and ``size`` is a function, wait for it at source size).
    ``keep=False`` only checks that every frame decodes, and returns []."""
    import av

    wanted = set(indices)
    last = max(indices)
    first = indices[0]
    rule = size if callable(size) else None
    target = None if callable(size) else size
    got: dict[int, Any] = {}
    with _open_container(path) as c:
        st = _stream(c, path)
        try:
            for k, frame in enumerate(c.decode(st)):
                if Image.MAX_IMAGE_PIXELS and frame.width * frame.height > Image.MAX_IMAGE_PIXELS:  # a size change
                    raise VideoError(
                        "video_too_large",
                        f"{path}: frame {k} is {frame.width}x{frame.height}, over Pillow's decompression-bomb limit",
                    )
                if k in wanted and keep:
                    image = frame.to_image()
                    if rule is not None and k == first:  # the size is known now: resize what waited for it
                        target = rule(image.width, image.height)
                        got = {i: fit_frame(im, target) for i, im in got.items()}
                    got[k] = fit_frame(image, target)
                    del image
                elif k in wanted:
                    got[k] = None
                del frame  # neither the decoded frame nor its source-size image waits for the next one
                if k >= last:
                    break
        except (av.error.FFmpegError, OSError) as e:
            raise VideoError("corrupt_video", f"{path}: cannot be decoded ({type(e).__name__}: {e})") from None
    missing = sorted(i for i in wanted if i not in got)
    if missing:
        raise VideoError(
            "corrupt_video", f"{path}: ends before frame {missing[0]} ({len(got)} of {len(wanted)} frames decoded)"
        )
    return [got[i] for i in indices] if keep else []


# --------------------------------------------------------------------------------------------------- entries


def _file(entry: VideoEntry, base_dir: str | os.PathLike) -> Path:
    assert entry.file is not None
    full = confined_path(entry.file, base_dir, kind="video")
    check_video_file(full)
    return full


def _file_plan(entry: VideoEntry, info: VideoInfo, sampling: FrameSampling) -> tuple[list[int], float, float]:
    """(frame indices, source fps, sample fps) of a file entry: its recorded sampling, else sampled now."""
    fps = entry.fps or info.fps
    if entry.frames_indices is not None:
        idx = entry.frames_indices
        if not idx:
            raise VideoError("empty_video", "the entry records no sampled frames")
        if max(idx) >= info.total_frames or min(idx) < 0:
            raise VideoError("corrupt_video", f"recorded frame {max(idx)} is past the video's {info.total_frames}")
        total = entry.total_num_frames or info.total_frames
        return idx, fps, entry.sample_fps or len(idx) / total * fps
    try:
        idx = sample_frame_indices(info.total_frames, fps, sampling_of(entry, sampling))
    except ValueError as e:
        raise VideoError("video_too_short", str(e)) from None
    return idx, fps, len(idx) / info.total_frames * fps


def video_shape(entry: VideoEntry, base_dir: str | os.PathLike, sampling: FrameSampling) -> tuple[int, int, int, float]:
    """(frames, width, height, sampled fps) of the video the model will see, from headers only (the first frame's, or
    the container's): what its token count is computed from (the fps: Qwen3-VL's timestamps). Every frame of a list
    of frames is checked here (its path confined, its header read), so a missing, outside or unreadable frame is a
    ``DataError`` naming it when the dataset is built (and in the dry run), not when the record is first drawn."""
    if entry.frames:
        sizes = []
        for j, f in enumerate(entry.frames):
            try:
                sizes.append(image_size(f, base_dir))
            except DataError as e:
                raise DataError(f"frame {j}: {e}") from None
        w, h = sizes[0]
        return len(entry.frames), w, h, float(entry.sample_fps or DEFAULT_FRAME_LIST_FPS)
    full = _file(entry, base_dir)
    info = probe_video(full)
    idx, _, sample_fps = _file_plan(entry, info, sampling)
    return len(idx), info.width, info.height, float(sample_fps)


def load_video(
    entry: VideoEntry,
    base_dir: str | os.PathLike,
    sampling: FrameSampling,
    fit: Callable[[int, int, int], tuple[int, int]] | None = None,
) -> RawVideo:
    """Decode a video entry's sampled frames (RGB) with their timestamps and sampled fps.

    ``fit(width, height, nframes)`` gives the size every frame is resized to as it is decoded, from the source size of
    the first sampled frame and the number of frames (memory then holds one source-size frame at a time); None keeps
    the source size."""
    source: list[tuple[int, int]] = []  # the first frame's size before resizing

    def size_of(w: int, h: int, n: int) -> tuple[int, int]:
        source.append((w, h))
        return fit(w, h, n) if fit is not None else (w, h)

    if entry.frames:
        frames: list[Image.Image] = []
        size = None
        for j, f in enumerate(entry.frames):
            try:
                image = decode_image(f, base_dir)
            except DataError as e:
                raise DataError(f"frame {j}: {e}") from None
            if j == 0:
                size = size_of(*image.size, len(entry.frames))
            frames.append(fit_frame(image, size))
            if frames[-1] is not image:
                image.close()
        rate = entry.sample_fps or DEFAULT_FRAME_LIST_FPS
        stamps = entry.timestamps or [j / rate for j in range(len(frames))]
        return RawVideo(frames, stamps, rate, source[0] if source else None)
    full = _file(entry, base_dir)
    info = probe_video(full)
    idx, fps, rate = _file_plan(entry, info, sampling)
    stamps = entry.timestamps or [i / fps for i in idx]
    frames = decode_frames(full, idx, lambda w, h: size_of(w, h, len(idx)))
    return RawVideo(frames, stamps, rate, source[0] if source else None)


def frame_bounds(entry: VideoEntry, bounds: tuple[int, int, int | None]) -> tuple[int, int, int | None]:
    """(min_pixels, max_pixels, total_pixels) of an entry's frames: ``bounds`` (the data's) narrowed by the entry's
    own keys, never widened (the processor resizes anything outside the data's bounds again)."""
    lo, hi, total = bounds
    p = entry.pixels
    lo = max(lo, p.get("min_pixels", lo))
    hi = min(hi, p.get("max_pixels", hi))
    if "total_pixels" in p:
        total = p["total_pixels"] if total is None else min(total, p["total_pixels"])
    return lo, max(lo, hi), total


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list[Any]:
    """Sort key putting ``frame_2`` before ``frame_10``."""
    return [int(p) if p.isdigit() else p.lower() for p in _DIGITS.split(name)]


@dataclass(frozen=True)
class VideoRules:
    """How a dataset turns video entries into what the model sees (picklable)."""

    factor: int
    """Pixels per merged token along a side (28 for Qwen2.5-VL, 32 for Qwen3-VL)."""
    min_pixels: int
    """Smallest frame area (``data.video_min_pixels`` or the video processor's)."""
    max_pixels: int
    """Largest frame area (``data.video_max_pixels`` or the video processor's)."""
    total_pixels: int | None
    """A video's pixel budget shared by its frames (``data.video_total_pixels``; None: qwen-vl-utils' default)."""
    sampling: FrameSampling
    """Frame sampling of files no preprocessing sampled (``data.video_fps`` ...)."""
    timestamp_tokens: Callable[[int, float], int] | None = None
    """Prompt tokens a video adds besides its pads, given its frames and sampled fps (Qwen3-VL's timestamp and
    vision start / end per temporal patch: :func:`timestamp_tokens`); None: none (Qwen2-VL, Qwen2.5-VL)."""


def timestamp_tokens(tokenizer: Any, family: Any, frames: int, fps: float) -> int:
    """The tokens a family's video layout adds besides its pads for ``frames`` frames (padded to pairs, as the model
    sees them) sampled at ``fps``: ``qwen_vl.video_layout`` of a 1 x 1 grid, less its pads."""
    pairs = -(-frames // FRAME_FACTOR)
    return len(qwen_vl.video_layout(tokenizer, family, (pairs, 1, 1), fps)) - pairs


def video_tokens(entry: VideoEntry, base_dir: str | os.PathLike, rules: VideoRules) -> int:
    """Prompt tokens of a video entry beyond its one pad's place: its ``<|video_pad|>`` tokens, plus Qwen3-VL's
    timestamps (``rules.timestamp_tokens``), from headers only; ``ValueError`` (from ``resized_size``) when its frames
    cannot be resized within the bounds."""
    n, w, h, fps = video_shape(entry, base_dir, rules.sampling)
    lo, hi, total = frame_bounds(entry, (rules.min_pixels, rules.max_pixels, rules.total_pixels))
    pads = num_video_tokens(n, w, h, rules.factor, lo, hi, total)
    return pads + (rules.timestamp_tokens(n, fps) if rules.timestamp_tokens is not None else 0)


def build_video(entry: VideoEntry, base_dir: str | os.PathLike, rules: VideoRules) -> Any:
    """The ``batch.Video`` of an entry: frames decoded, resized to one size with qwen-vl-utils' rules and padded to
    pairs; timestamps and sampled fps kept."""
    lo, hi, total = frame_bounds(entry, (rules.min_pixels, rules.max_pixels, rules.total_pixels))

    def fit(w: int, h: int, n: int) -> tuple[int, int]:
        return video_frame_size(w, h, n, rules.factor, lo, hi, total)

    raw = load_video(entry, base_dir, rules.sampling, fit)  # resized as decoded: one source-size frame at a time
    if not raw.frames:
        raise VideoError("empty_video", "the video has no frames")
    frames = resize_frames(raw.frames, raw.frames[0].size)  # already at the size: pads to pairs
    stamps = list(raw.timestamps)
    while len(stamps) < len(frames):  # padded frames repeat the last one
        stamps.append(stamps[-1])
    return Video(frames=frames, timestamps=stamps, sample_fps=raw.sample_fps, original_size=raw.source_size)
