"""Videos for the preprocess scripts: a video file or a folder of frames → its sampled frames, stored the way images
are (``{bytes, path}`` structs), with the sampling recorded; every failure a reject reason.

Sampling follows qwen-vl-utils' ``fetch_video`` and happens once, here: ``--video-fps`` frames per second (at least
``--video-min-frames``, at most ``--video-max-frames``, always a whole number of pairs) or exactly ``--video-nframes``,
evenly spaced over the video. A folder of frames (image files, sorted by name with numbers in order) is a video at
``--frames-fps``. The record keeps, per video::

    frames: [{bytes, path}]       # the sampled frames (a video file's: resized to the frame bounds, PNG)
    video: str | null             # with --store-paths and a video file: the file (decoded at training time)
    video_fps, total_num_frames   # the source's frame rate and length
    frames_indices, timestamps    # which source frames were taken, and when (seconds)
    sample_fps                    # frames per second of the sampled frames (drives M-RoPE's temporal positions)

Video files are decoded with PyAV (FFmpeg), only inside the folder media are read from (``--image-dir``), only as
regular files up to ``--max-video-bytes``, in an allowed container format (``vlmrl.data.video.VIDEO_FORMATS``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmrl.data.video import (
    MAX_VIDEO_FILE_BYTES,
    VideoError,
    check_video_file,
    decode_frames,
    natural_key,
    probe_video,
)
from vlmrl.models.qwen_vl import FrameSampling, sample_frame_indices, video_frame_size
from vlmrl.preprocess.common import (
    MAX_IMAGE_BYTES,
    ImageRules,
    RecordError,
    check_image,
    encode_pil,
    image_struct,
    inside_root,
)

FRAME_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
"""Files of a frame folder that are frames (others are ignored)."""

QWEN25_VL_VIDEO_PIXELS = (128 * 28 * 28, 768 * 28 * 28)
"""Qwen2.5-VL's video processor's default (min_pixels, max_pixels) per frame (qwen-vl-utils' VIDEO_*_TOKEN_NUM)."""


@dataclass(frozen=True)
class VideoOptions:
    """How source videos are read, sampled and checked (picklable: shipped to worker processes)."""

    root: str | None = None
    """Folder video paths must stay inside (None: rows may not name files)."""
    max_bytes: int = MAX_VIDEO_FILE_BYTES
    """Largest video file read."""
    max_frame_bytes: int = MAX_IMAGE_BYTES
    """Largest frame file of a frame folder read."""
    sampling: FrameSampling = field(default_factory=FrameSampling)
    """Frame sampling (qwen-vl-utils' rules)."""
    frames_fps: float = 2.0
    """Frame rate of a folder of frames."""
    min_pixels: int = QWEN25_VL_VIDEO_PIXELS[0]
    """Training's ``data.video_min_pixels``: the smallest frame area."""
    max_pixels: int = QWEN25_VL_VIDEO_PIXELS[1]
    """Training's ``data.video_max_pixels``: the largest frame area."""
    total_pixels: int | None = None
    """Training's ``data.video_total_pixels``: a video's pixel budget (None: qwen-vl-utils' default)."""

    def frame_size(self, width: int, height: int, nframes: int) -> tuple[int, int]:
        """The size the frames of a video of ``nframes`` frames are resized to; bad_aspect_ratio when they cannot be."""
        try:
            return video_frame_size(width, height, nframes, 28, self.min_pixels, self.max_pixels, self.total_pixels)
        except ValueError as e:
            raise RecordError("bad_aspect_ratio", f"video frames: {e}") from None


def add_video_args(parser: argparse.ArgumentParser) -> None:
    """The video flags of a preprocess script."""
    g = parser.add_argument_group("videos (sampled once, here, with qwen-vl-utils' fetch_video rules)")
    g.add_argument("--video-fps", type=float, default=2.0, help="frames sampled per second of video")
    g.add_argument("--video-min-frames", type=int, default=4, help="fewest frames sampled")
    g.add_argument("--video-max-frames", type=int, default=768, help="most frames sampled")
    g.add_argument("--video-nframes", type=int, default=None, help="sample exactly this many frames instead")
    g.add_argument("--frames-fps", type=float, default=2.0, help="frame rate of a folder of frames")
    g.add_argument(
        "--video-min-pixels",
        type=int,
        default=QWEN25_VL_VIDEO_PIXELS[0],
        help="training's data.video_min_pixels (frames are resized and checked with it)",
    )
    g.add_argument(
        "--video-max-pixels", type=int, default=QWEN25_VL_VIDEO_PIXELS[1], help="training's data.video_max_pixels"
    )
    g.add_argument(
        "--video-total-pixels",
        type=int,
        default=None,
        help="training's data.video_total_pixels (a video's pixel budget shared by its frames)",
    )
    g.add_argument("--max-video-bytes", type=int, default=MAX_VIDEO_FILE_BYTES, help="largest video file read")


def video_options(args: argparse.Namespace, root: str | os.PathLike | None) -> VideoOptions:
    """The ``VideoOptions`` of a script's command line, with ``root`` the folder video paths must stay inside."""
    if args.video_nframes is not None and args.video_nframes < 2:
        raise ValueError(f"--video-nframes={args.video_nframes}: at least 2 (frames go in pairs)")
    if not args.video_fps > 0 or not args.frames_fps > 0:
        raise ValueError("--video-fps and --frames-fps must be > 0")
    if not 0 < args.video_min_pixels <= args.video_max_pixels:  # qwen-vl-utils would assert on every frame
        raise ValueError(
            f"--video-min-pixels={args.video_min_pixels} must be > 0 and at most --video-max-pixels="
            f"{args.video_max_pixels}"
        )
    return VideoOptions(
        root=str(Path(root).resolve()) if root is not None else None,
        max_bytes=int(args.max_video_bytes),
        max_frame_bytes=int(getattr(args, "max_image_bytes", MAX_IMAGE_BYTES)),
        sampling=FrameSampling(args.video_fps, args.video_min_frames, args.video_max_frames, args.video_nframes),
        frames_fps=float(args.frames_fps),
        min_pixels=int(args.video_min_pixels),
        max_pixels=int(args.video_max_pixels),
        total_pixels=args.video_total_pixels,
    )


def _reject(e: VideoError, what: str) -> RecordError:
    return RecordError(e.reason, f"{what}: {e}")


def _source(rel: str, opts: VideoOptions) -> Path:
    """The file or folder a row names, inside ``opts.root``."""
    if opts.root is None:
        raise RecordError("unreadable_video", f"{rel}: this input's rows cannot name video files")
    if not rel.strip():
        raise RecordError("unreadable_video", "an empty video path")
    full = inside_root(rel, opts.root, "video")
    if not full.exists():
        raise RecordError("unreadable_video", f"{rel}: no such file or folder")
    return full


def _timing(indices: list[int], total: int, fps: float) -> dict[str, Any]:
    return {
        "video_fps": float(fps),
        "total_num_frames": int(total),
        "frames_indices": [int(i) for i in indices],
        "timestamps": [i / fps for i in indices],
        "sample_fps": len(indices) / total * fps,
    }


def _indices(total: int, fps: float, opts: VideoOptions, what: str) -> list[int]:
    if total == 0:
        raise RecordError("empty_video", f"{what}: no frames")
    try:
        return sample_frame_indices(total, fps, opts.sampling)
    except ValueError as e:
        raise RecordError("video_too_short", f"{what}: {e}") from None


def video_struct(
    rel: str, opts: VideoOptions, *, store_paths: bool, output_dir: str | os.PathLike, spill_name: str
) -> dict[str, Any]:
    """The stored struct of the video (file or frame folder) a row names at ``rel``: frames sampled, checked and
    stored, the sampling recorded. Raises ``RecordError``."""
    full = _source(rel, opts)
    if full.is_dir():
        return _folder_struct(full, rel, opts, store_paths=store_paths, output_dir=output_dir, spill_name=spill_name)
    try:
        check_video_file(full, opts.max_bytes)
        info = probe_video(full)
    except VideoError as e:
        raise _reject(e, rel) from None
    idx = _indices(info.total_frames, info.fps, opts, rel)
    timing = _timing(idx, info.total_frames, info.fps)
    size = opts.frame_size(info.width, info.height, len(idx))
    try:  # each frame resized as it is decoded: memory bounded by the output's size, not the source's
        frames = decode_frames(full, idx, size, keep=not store_paths)
    except VideoError as e:
        raise _reject(e, rel) from None
    if store_paths:  # the file itself (its frames are decoded again at training time, the recorded ones)
        target = _spill_file(full, Path(output_dir), f"videos/{spill_name}{full.suffix.lower()}")
        return {"frames": [], "video": target, **timing}
    stored = [{"bytes": encode_pil(f), "path": None} for f in frames]
    return {"frames": stored, "video": None, **timing}


def _folder_struct(
    folder: Path, rel: str, opts: VideoOptions, *, store_paths: bool, output_dir: str | os.PathLike, spill_name: str
) -> dict[str, Any]:
    try:
        names = sorted((p.name for p in folder.iterdir() if p.suffix.lower() in FRAME_EXTENSIONS), key=natural_key)
    except OSError as e:
        raise RecordError("unreadable_video", f"{rel}: {type(e).__name__}: {e.strerror or e}") from None
    idx = _indices(len(names), opts.frames_fps, opts, rel)
    rules = ImageRules(root=opts.root, max_bytes=opts.max_frame_bytes, min_pixels=28 * 28, max_pixels=2**62)
    frames = []
    for k, i in enumerate(idx):
        path = os.path.relpath(folder / names[i], opts.root)
        try:
            checked = check_image(path=path, rules=rules)
        except RecordError as e:
            reason = {
                "image_outside_dir": "video_outside_dir",
                "image_too_large": "video_too_large",
                "image_file_too_large": "video_file_too_large",
                "corrupt_image": "corrupt_video",
                "bad_aspect_ratio": "bad_aspect_ratio",
            }.get(e.reason, "unreadable_video")
            raise RecordError(reason, f"{rel}: frame {names[i]}: {e.detail}") from None
        if k == 0:
            opts.frame_size(checked.width, checked.height, len(idx))
        frames.append(
            image_struct(
                checked,
                source_path=folder / names[i],
                source_name=f"{rel.rstrip('/')}/{names[i]}",
                store_paths=store_paths,
                output_dir=output_dir,
                spill_name=f"{spill_name}/{k:05d}",
            )
        )
    return {"frames": frames, "video": None, **_timing(idx, len(names), opts.frames_fps)}


def frames_struct(
    frames: list[Image.Image],
    fps: float,
    *,
    store_paths: bool = False,
    output_dir: str | os.PathLike = ".",
    spill_name: str = "videos/frames",
) -> dict[str, Any]:
    """The stored struct of frames made in memory (a synthetic video at ``fps``): every frame kept as drawn (PNG; the
    dataset resizes them with training's bounds, as it does images; ``store_paths``: as files under ``output_dir``),
    their timing recorded."""
    if len(frames) < 2 or len(frames) % 2:
        raise RecordError("video_too_short", f"{len(frames)} frames: a video needs a whole number of pairs")
    stored = [
        image_struct(
            check_image(encode_pil(f)),
            source_path=None,
            source_name=None,
            store_paths=store_paths,
            output_dir=output_dir,
            spill_name=f"{spill_name}/{k:05d}",
        )
        for k, f in enumerate(frames)
    ]
    return {"frames": stored, "video": None, **_timing(list(range(len(frames))), len(frames), fps)}


def _spill_file(src: Path, out: Path, name: str) -> str:
    """``src`` referred to from ``out`` (the parquet's folder): where it is when inside it, else hard-linked (or
    copied) to ``out/name``; returns the path relative to ``out``."""
    import shutil

    out = out.resolve()
    if src.is_relative_to(out):
        return os.path.relpath(src, out)
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(src, target)
    except OSError:
        shutil.copyfile(src, target)
    return os.path.relpath(target, out)
