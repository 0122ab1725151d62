"""A built-in visual task generator: coloured shapes drawn with Pillow, no download needed.

Task families (``data_source = synthetic/<family>``):

- ``colour``: one large circle or square covering most of the canvas; answer its colour name. The question text is
  the same for every record, so the image is the only signal: a tiny random model learns it from scratch in seconds.
- ``shape``: one shape; answer its name (circle, square, triangle, ...).
- ``count``: several small non-overlapping shapes; answer how many (a decimal string).
- ``position``: two shapes; answer where the first is relative to the second: left, right, top or bottom.
- ``grounding``: a target among distractors; answer its bounding box ``[x1, y1, x2, y2]`` (JSON, original pixels).
- ``zoom``: a small square near the centre of a large canvas strewn with dots of every colour; answer the square's
  colour. Drawn for large images (``--image-size 896``): at a small model's pixel budget the square is a few pixels
  among the dots, and only a zoomed-in view (the ``image_zoom`` tool) shows it plainly. The record's
  ``extra_info.objects`` holds the square's box.
- ``video_colour``, ``video_motion``, ``video_order``: videos (``preprocess/synthetic_video.py``).

Label families are balanced (class counts differ by at most one per split). Every record is drawn from its own
seeded RNG (seed, split, index), so the output is byte-identical for a seed whatever ``--num-proc`` is.

    python preprocess/synthetic.py --output-dir data/synth --families colour --train-size 512 --test-size 64
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from vlmrl.preprocess.common import (
    build_record,
    check_image,
    check_placeholders,
    encode_pil,
    image_struct,
    record_features,
)
from vlmrl.preprocess.pipeline import (
    Item,
    SplitResult,
    add_common_args,
    cli_main,
    run_split,
    write_report,
)
from vlmrl.preprocess.synthetic_video import VIDEO_FAMILIES, build_video_task, video_classes

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 25),
    "green": (25, 170, 40),
    "blue": (30, 60, 230),
    "yellow": (245, 215, 20),
    "purple": (140, 40, 180),
    "orange": (250, 135, 10),
    "cyan": (20, 200, 220),
    "magenta": (225, 30, 200),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
    "brown": (130, 75, 30),
    "pink": (250, 150, 190),
    "white": (255, 255, 255),
}
"""Named colours the generator draws with (strongly distinct by default: red, green, blue)."""

SHAPES = ("circle", "square", "triangle", "diamond")
"""Shapes the generator can draw."""

_FULL_SHAPES = ("circle", "square")  # shapes filling >= 78% of their box: the colour family draws these

FAMILIES = ("colour", "shape", "count", "position", "grounding", "zoom", *VIDEO_FAMILIES)
"""Task families (the video ones drawn by ``synthetic_video.py``)."""

POSITIONS = ("left", "right", "top", "bottom")
"""Answers of the position family: where the first shape is relative to the second."""

QUESTIONS = {
    "colour": "<image>What colour is the shape? Answer with one word.",
    "shape": "<image>What shape is shown? Answer with one word.",
    "count": "<image>How many shapes are in the image? Answer with a number.",
    "position": "<image>Where is the {a} relative to the {b}? Answer with one word: left, right, top or bottom.",
    "grounding": "<image>Find the {a}. Give its bounding box as [x1, y1, x2, y2] in pixels.",
    "zoom": "<image>What colour is the small square in the centre? Answer with one word.",
}
"""Question templates per family."""


@dataclass(frozen=True)
class SynthConfig:
    """Everything that decides the generated data (the output is a pure function of it)."""

    families: tuple[str, ...] = ("colour",)
    colours: tuple[str, ...] = ("red", "green", "blue")
    shapes: tuple[str, ...] = ("circle", "square", "triangle")
    width: int = 56
    height: int = 56
    background: str = "white"
    min_count: int = 1
    max_count: int = 4
    distractors: int = 2
    seed: int = 0
    video_frames: int = 4
    video_fps: float = 2.0

    def __post_init__(self) -> None:
        for f in self.families:
            if f not in FAMILIES:
                raise ValueError(f"unknown family {f!r}; choose from {', '.join(FAMILIES)}")
        for c in (*self.colours, self.background):
            if c not in PALETTE:
                raise ValueError(f"unknown colour {c!r}; choose from {', '.join(PALETTE)}")
        for s in self.shapes:
            if s not in SHAPES:
                raise ValueError(f"unknown shape {s!r}; choose from {', '.join(SHAPES)}")
        if self.background in self.colours:
            raise ValueError(f"background {self.background!r} is also a shape colour")
        if len(set(self.colours)) != len(self.colours) or len(set(self.shapes)) != len(self.shapes):
            raise ValueError("colours and shapes must not repeat")
        if not self.colours or not self.shapes or not self.families:
            raise ValueError("need at least one family, colour and shape")
        if not 1 <= self.min_count <= self.max_count:
            raise ValueError("need 1 <= min_count <= max_count")
        if min(self.width, self.height) < 16:
            raise ValueError("images must be at least 16x16 pixels")
        if self.video_frames < 2 or self.video_frames % 2 or not self.video_fps > 0:
            raise ValueError("videos need an even number of frames (>= 2) and a frame rate > 0")
        if "position" in self.families and len(self.colours) * len(self.shapes) < 2:
            raise ValueError("the position family needs two distinguishable shapes (colours x shapes >= 2)")

    def classes(self, family: str) -> list[str]:
        """Candidate answers of a label family ([] for grounding)."""
        if family in VIDEO_FAMILIES:
            return video_classes(self.colours, family)
        if family in ("colour", "zoom"):
            return list(self.colours)
        if family == "shape":
            return list(self.shapes)
        if family == "count":
            return [str(n) for n in range(self.min_count, self.max_count + 1)]
        if family == "position":
            return list(POSITIONS)
        return []


# ------------------------------------------------------------------------------------------------------ drawing


Box = tuple[int, int, int, int]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: Box, colour: str) -> None:
    """Draw a filled shape inside ``box`` (x1, y1, x2, y2; inclusive pixel bounds)."""
    x1, y1, x2, y2 = box
    fill = PALETTE[colour]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([((x1 + x2) / 2, y1), (x2, y2), (x1, y2)], fill=fill)
    elif shape == "diamond":
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        draw.polygon([(cx, y1), (x2, cy), (cx, y2), (x1, cy)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def _square_box(rng: random.Random, size: int, w: int, h: int) -> Box:
    x = rng.randint(0, w - size)
    y = rng.randint(0, h - size)
    return (x, y, x + size - 1, y + size - 1)


def _overlaps(a: Box, b: Box, gap: int) -> bool:
    return not (a[2] + gap < b[0] or b[2] + gap < a[0] or a[3] + gap < b[1] or b[3] + gap < a[1])


def _place(rng: random.Random, n: int, size: int, w: int, h: int, gap: int = 2) -> list[Box]:
    """``n`` non-overlapping square boxes (rejection sampling; deterministic for the RNG)."""
    for _ in range(200):
        boxes: list[Box] = []
        for _ in range(n):
            for _ in range(100):
                b = _square_box(rng, size, w, h)
                if all(not _overlaps(b, o, gap) for o in boxes):
                    boxes.append(b)
                    break
        if len(boxes) == n:
            return boxes
    raise ValueError(f"cannot place {n} shapes of {size}px on a {w}x{h} canvas; use a larger --image-size")


def _describe(obj: dict[str, Any]) -> str:
    return f"{obj['colour']} {obj['shape']}"


def make_example(cfg: SynthConfig, family: str, label: str | None, rng: random.Random) -> dict[str, Any]:
    """Draw one example: ``{image, question, answer, objects}`` (objects: ``[{colour, shape, box}]``)."""
    w, h = cfg.width, cfg.height
    short = min(w, h)
    img = Image.new("RGB", (w, h), PALETTE[cfg.background])
    draw = ImageDraw.Draw(img)
    objects: list[dict[str, Any]] = []

    def add(shape: str, colour: str, box: Box) -> dict[str, Any]:
        draw_shape(draw, shape, box, colour)
        obj = {"colour": colour, "shape": shape, "box": list(box)}
        objects.append(obj)
        return obj

    if family == "colour":  # a filled circle or square of 80-95% of the short side: colour covers most pixels
        size = int(short * rng.uniform(0.8, 0.95))
        add(
            rng.choice([s for s in cfg.shapes if s in _FULL_SHAPES] or ["square"]),
            str(label),
            _square_box(rng, size, w, h),
        )
        question, answer = QUESTIONS["colour"], str(label)
    elif family == "shape":
        size = int(short * rng.uniform(0.55, 0.85))
        add(str(label), rng.choice(cfg.colours), _square_box(rng, size, w, h))
        question, answer = QUESTIONS["shape"], str(label)
    elif family == "count":
        n = int(str(label))
        size = max(6, short // (2 + cfg.max_count // 2))
        for box in _place(rng, n, size, w, h):
            add(rng.choice(cfg.shapes), rng.choice(cfg.colours), box)
        question, answer = QUESTIONS["count"], str(n)
    elif family == "position":
        pairs = [(c, s) for c in cfg.colours for s in cfg.shapes]
        (ca, sa), (cb, sb) = rng.sample(pairs, 2)
        size = max(6, short // 4)
        a_box, b_box = _position_boxes(rng, str(label), size, w, h)
        a = add(sa, ca, a_box)
        b = add(sb, cb, b_box)
        question = QUESTIONS["position"].format(a=_describe(a), b=_describe(b))
        answer = str(label)
    elif family == "grounding":
        pairs = [(c, s) for c in cfg.colours for s in cfg.shapes]
        n_other = min(cfg.distractors, len(pairs) - 1)
        chosen = rng.sample(pairs, n_other + 1)
        size = max(6, short // 4)
        boxes = _place(rng, n_other + 1, size, w, h)
        target = add(chosen[0][1], chosen[0][0], boxes[0])
        for (c, s), box in zip(chosen[1:], boxes[1:]):
            add(s, c, box)
        question = QUESTIONS["grounding"].format(a=_describe(target))
        answer = json.dumps(target["box"])
    elif family == "zoom":
        side, jitter = max(2, short // 36), short // 112
        x, y = (w - side) // 2 + rng.randint(-jitter, jitter), (h - side) // 2 + rng.randint(-jitter, jitter)
        target = (x, y, x + side - 1, y + side - 1)
        _strew_dots(draw, rng, cfg.colours, w, h, keep_clear=target)
        add("square", str(label), target)
        question, answer = QUESTIONS["zoom"], str(label)
    else:
        raise ValueError(f"unknown family {family!r}")
    return {"image": img, "question": question, "answer": answer, "objects": objects}


def _strew_dots(
    draw: ImageDraw.ImageDraw, rng: random.Random, colours: Sequence[str], w: int, h: int, keep_clear: Box
) -> None:
    """Cover ~15% of the canvas with dots (diameter 1/180 to 1/90 of the short side) of random ``colours``, none
    touching ``keep_clear``: at a small pixel budget every patch holds as much of each colour as the target square's."""
    short = min(w, h)
    lo, hi = max(1, short // 180), max(2, short // 90)
    mean_area = math.pi / 4 * ((lo + hi) / 2) ** 2
    for _ in range(int(0.15 * w * h / mean_area)):
        d = rng.randint(lo, hi)
        x, y = rng.randint(0, w - d), rng.randint(0, h - d)
        if not _overlaps((x, y, x + d - 1, y + d - 1), keep_clear, 2):
            draw.ellipse((x, y, x + d - 1, y + d - 1), fill=PALETTE[rng.choice(colours)])


def _position_boxes(rng: random.Random, where: str, size: int, w: int, h: int) -> tuple[Box, Box]:
    """Boxes of shape A and reference B with A clearly ``where`` of B: separated along one axis by at least one
    shape size, offset across it by less than half the separation."""
    horizontal = where in ("left", "right")
    along, across = (w, h) if horizontal else (h, w)
    sep = rng.randint(size + 2, along - size)  # distance between the two boxes' starts along the axis
    start = rng.randint(0, along - size - sep)
    first, second = start, start + sep  # first = smaller coordinate
    a_along, b_along = (first, second) if where in ("left", "top") else (second, first)
    max_off = min(across - size, max(0, sep // 2 - 1))
    b_across = rng.randint(0, across - size)
    lo, hi = max(0, b_across - max_off), min(across - size, b_across + max_off)
    a_across = rng.randint(lo, hi)

    def box(al: int, ac: int) -> Box:
        x, y = (al, ac) if horizontal else (ac, al)
        return (x, y, x + size - 1, y + size - 1)

    return box(a_along, a_across), box(b_along, b_across)


# ------------------------------------------------------------------------------------------------------ records


def extra_info_features() -> dict[str, Any]:
    """``datasets`` features of the synthetic extra_info fields beyond split/index/answer/question."""
    import datasets

    v = datasets.Value
    return {
        "choices": datasets.List(v("string")),
        "objects": datasets.List({"colour": v("string"), "shape": v("string"), "box": datasets.List(v("int64"))}),
    }


@dataclass(frozen=True)
class Task:
    """One record to generate."""

    split: str
    index: int
    family: str
    label: str | None


def plan_split(cfg: SynthConfig, split: str, size: int) -> list[Task]:
    """The records of a split: families round-robin by index; each label family's labels balanced and shuffled by
    (seed, split, family)."""
    fams = list(cfg.families)
    per_family: dict[str, list[int]] = {f: [i for i in range(size) if fams[i % len(fams)] == f] for f in fams}
    labels: dict[int, str | None] = {}
    for f, idx in per_family.items():
        classes = cfg.classes(f)
        if not classes:
            labels.update({i: None for i in idx})
            continue
        lab = [classes[k % len(classes)] for k in range(len(idx))]
        random.Random(f"{cfg.seed}:{split}:{f}:labels").shuffle(lab)
        labels.update(zip(idx, lab))
    return [Task(split, i, fams[i % len(fams)], labels[i]) for i in range(size)]


def build_task(task: Task, cfg: SynthConfig, store_paths: bool, output_dir: str) -> dict[str, Any]:
    """Draw and validate one record (runs in a worker)."""
    if task.family in VIDEO_FAMILIES:
        return build_video_task(task, cfg, store_paths, output_dir)
    rng = random.Random(f"{cfg.seed}:{task.split}:{task.index}")
    ex = make_example(cfg, task.family, task.label, rng)
    checked = check_image(encode_pil(ex["image"]))
    check_placeholders(ex["question"], 1)
    img = image_struct(
        checked,
        source_path=None,
        source_name=None,
        store_paths=store_paths,
        output_dir=output_dir,
        spill_name=f"{task.split}/{task.index:07d}_0",
    )
    return build_record(
        data_source=f"synthetic/{task.family}",
        question=ex["question"],
        answer=ex["answer"],
        images=[img],
        split=task.split,
        index=task.index,
        ability="visual",
        extra_info={"choices": cfg.classes(task.family), "objects": ex["objects"]},
    )


def generate(
    cfg: SynthConfig,
    output_dir: str | Path,
    splits: dict[str, int],
    *,
    num_proc: int = 1,
    store_paths: bool = False,
    strict: bool = False,
    progress: bool = True,
    row_group_size: int = 100,
    quiet: bool = False,
) -> dict[str, Any]:
    """Generate ``{split: size}`` into ``output_dir/<split>.parquet``; returns the report."""
    started = time.perf_counter()
    features = record_features(extra_info_features(), videos=bool(set(cfg.families) & set(VIDEO_FAMILIES)))
    results: list[SplitResult] = []
    build = functools.partial(build_task, cfg=cfg, store_paths=store_paths, output_dir=str(output_dir))
    for split, size in splits.items():
        tasks = plan_split(cfg, split, size)
        items = (Item(f"synthetic {split} index {t.index} ({t.family})", t) for t in tasks)
        results.append(
            run_split(
                split,
                items,
                build,
                Path(output_dir) / f"{split}.parquet",
                features,
                total=size,
                num_proc=num_proc,
                strict=strict,
                progress=progress,
                row_group_size=row_group_size,
            )
        )
    config = {**asdict(cfg), "splits": splits, "store_paths": store_paths}
    return write_report(output_dir, results, name="synthetic", config=config, started=started, quiet=quiet)


def _csv(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _size(s: str) -> tuple[int, int]:
    w, _, h = s.lower().partition("x")
    return int(w), int(h or w)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--families", type=_csv, default=("colour",), help=f"comma list of {','.join(FAMILIES)}")
    p.add_argument("--colours", "--colors", type=_csv, default=("red", "green", "blue"), help="comma list of colours")
    p.add_argument("--shapes", type=_csv, default=("circle", "square", "triangle"), help="comma list of shapes")
    p.add_argument("--image-size", type=_size, default=(56, 56), help="W or WxH in pixels (default 56)")
    p.add_argument("--background", default="white", help="background colour name")
    p.add_argument("--min-count", type=int, default=1, help="fewest shapes in the count family")
    p.add_argument("--max-count", type=int, default=4, help="most shapes in the count family")
    p.add_argument("--distractors", type=int, default=2, help="other shapes in the grounding family")
    p.add_argument("--train-size", type=int, default=1000, help="records in train.parquet")
    p.add_argument("--test-size", type=int, default=100, help="records in test.parquet")
    p.add_argument("--seed", type=int, default=0, help="generation seed")
    p.add_argument("--video-frames", type=int, default=4, help="frames of a video family's video (even)")
    p.add_argument("--video-fps", type=float, default=2.0, help="frames per second of a video family's video")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point: parse flags, generate, report."""
    a = parse_args(argv)
    cfg = SynthConfig(
        families=a.families,
        colours=a.colours,
        shapes=a.shapes,
        width=a.image_size[0],
        height=a.image_size[1],
        background=a.background,
        min_count=a.min_count,
        max_count=a.max_count,
        distractors=a.distractors,
        seed=a.seed,
        video_frames=a.video_frames,
        video_fps=a.video_fps,
    )
    splits = {k: v for k, v in (("train", a.train_size), ("test", a.test_size)) if v > 0}
    return generate(
        cfg,
        a.output_dir,
        splits,
        num_proc=a.num_proc,
        store_paths=a.store_paths,
        strict=a.strict,
        progress=not a.no_progress,
        row_group_size=a.row_group_size,
    )


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    raise SystemExit(cli_main(main))
