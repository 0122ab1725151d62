"""The synthetic video families of ``preprocess/synthetic.py`` (``data_source = synthetic/<family>``), drawn with
Pillow:

- ``video_colour``: one large circle or square, the same colour in every frame, drifting a few pixels; answer its
  colour. Every frame holds the answer: the frame-level task (it learns like the image ``colour`` family).
- ``video_motion``: a small square moving left, right, up or down at constant speed, leaving one edge and coming
  back at the other (the canvas wraps around); answer which way it moves. No single frame holds the answer: in each
  frame the square is anywhere, whatever its direction (its start is uniform on the wrapped canvas); only how it
  moves from frame to frame does.
- ``video_order``: a large shape of one colour for the first half of the frames, then another colour; answer which
  colour appears second. Both colours are in every video: only when each appears tells them apart.

A video has ``--video-frames`` frames (a whole number of pairs) at ``--video-fps`` frames per second, stored as PNG
frames with their timing (``preprocess/video.py``); sizes as the image families (``--image-size``).
"""

from __future__ import annotations

import random
from typing import Any

from PIL import Image, ImageDraw

VIDEO_FAMILIES = ("video_colour", "video_motion", "video_order")
"""The video task families."""

DIRECTIONS = ("left", "right", "up", "down")
"""Answers of ``video_motion``."""

VIDEO_QUESTIONS = {
    "video_colour": "<video>What colour is the shape? Answer with one word.",
    "video_motion": "<video>Which way does the {a} move? Answer with one word: left, right, up or down.",
    "video_order": "<video>The shape changes colour. Which colour does it have second? Answer with one word.",
}
"""Question templates per video family."""


def video_classes(colours: tuple[str, ...], family: str) -> list[str]:
    """Candidate answers of a video family."""
    return list(DIRECTIONS) if family == "video_motion" else list(colours)


def make_video_example(cfg: Any, family: str, label: str, rng: random.Random) -> dict[str, Any]:
    """Draw one video example: ``{frames, question, answer, objects}`` (objects: the first frame's ``[{colour, shape,
    box}]``). ``cfg`` is the generator's ``SynthConfig`` (colours, shapes, size, ``video_frames``)."""
    from vlmrl.preprocess.synthetic import PALETTE, draw_shape

    w, h, n = cfg.width, cfg.height, cfg.video_frames
    short = min(w, h)
    if family == "video_order" and len(cfg.colours) < 2:
        raise ValueError("the video_order family needs at least two colours")
    full = [s for s in cfg.shapes if s in ("circle", "square")] or ["square"]
    boxes: list[tuple[int, int, int, int]] = []
    colours: list[str] = []
    if family in ("video_colour", "video_order"):
        shape = rng.choice(full)
        size = int(short * rng.uniform(0.7, 0.85))
        x, y = rng.randint(0, w - size), rng.randint(0, h - size)
        other = rng.choice([c for c in cfg.colours if c != label]) if family == "video_order" else label
        for k in range(n):
            dx, dy = rng.randint(-2, 2), rng.randint(-2, 2)  # a little drift: frames differ, the colour does not
            bx, by = min(max(0, x + dx), w - size), min(max(0, y + dy), h - size)
            boxes.append((bx, by, bx + size - 1, by + size - 1))
            colours.append(label if family == "video_colour" or k >= n // 2 else other)
        question = VIDEO_QUESTIONS[family]
    elif family == "video_motion":
        shape = "square"
        size = max(6, short // 5)
        horizontal = label in ("left", "right")
        along, across = (w, h) if horizontal else (h, w)
        step = max(2, along // (2 * n))  # a clear move between frames, far shorter than the way round
        sign = 1 if label in ("right", "down") else -1
        start = rng.randrange(along)
        off = rng.randint(0, across - size)
        colour = rng.choice(cfg.colours)
        for k in range(n):
            p = (start + sign * step * k) % along
            x, y = (p, off) if horizontal else (off, p)
            boxes.append((x, y, x + size - 1, y + size - 1))
            colours.append(colour)
        question = VIDEO_QUESTIONS[family].format(a=f"{colour} square")
    else:
        raise ValueError(f"unknown video family {family!r}")
    frames = []
    for box, colour in zip(boxes, colours):
        img = Image.new("RGB", (w, h), PALETTE[cfg.background])
        draw = ImageDraw.Draw(img)
        draw_shape(draw, shape, box, colour)
        x1, y1, x2, y2 = box
        if x2 >= w:  # the part past the right edge comes back at the left (the motion family wraps around)
            draw_shape(draw, shape, (x1 - w, y1, x2 - w, y2), colour)
        if y2 >= h:
            draw_shape(draw, shape, (x1, y1 - h, x2, y2 - h), colour)
        frames.append(img)
    objects = [{"colour": colours[0], "shape": shape, "box": list(boxes[0])}]
    return {"frames": frames, "question": question, "answer": label, "objects": objects}


def build_video_task(task: Any, cfg: Any, store_paths: bool = False, output_dir: str = ".") -> dict[str, Any]:
    """Draw and validate one video record of a ``synthetic.Task`` (runs in a worker); ``store_paths`` writes the
    frames as files under ``output_dir`` instead of into the record."""
    from vlmrl.preprocess.common import build_record, check_placeholders
    from vlmrl.preprocess.video import frames_struct

    rng = random.Random(f"{cfg.seed}:{task.split}:{task.index}")
    ex = make_video_example(cfg, task.family, str(task.label), rng)
    check_placeholders(ex["question"], 0, 1)
    return build_record(
        data_source=f"synthetic/{task.family}",
        question=ex["question"],
        answer=ex["answer"],
        images=[],
        videos=[
            frames_struct(
                ex["frames"],
                cfg.video_fps,
                store_paths=store_paths,
                output_dir=output_dir,
                spill_name=f"{task.split}/{task.index:07d}_video0",
            )
        ],
        split=task.split,
        index=task.index,
        ability="visual",
        extra_info={"choices": video_classes(cfg.colours, task.family), "objects": ex["objects"]},
    )
