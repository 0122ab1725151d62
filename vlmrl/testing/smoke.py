"""What the shipped pipelines swap in smoke mode (``SMOKE=1 bash examples/<pipeline>.sh``): only what a laptop or CI
machine cannot hold.

* the model: the tiny random Qwen2.5-VL (``python -m vlmrl.testing.smoke model`` prints its cached folder);
* the data: a small stand-in in the pipeline's own input format, which then goes through the pipeline's own
  preprocess step: Geometry3K's hub layout (``DIR/data/{train,test}-00000-of-00001.parquet`` with ``images``,
  ``problem``, ``answer``) for geo3k, grounding JSONL lines with image files and boxes for grounding;
* the device, the worker count, the scale (steps, batch sizes, response length) and wandb's network: the overrides
  ``python -m vlmrl.testing.smoke overrides`` prints, appended after the pipeline's own.

Every other flag of the pipeline runs as the GPU run sets it (gradient checkpointing, KL and the reference with its
offload, LoRA, validation, checkpoints, vision freezing, the cache flag...).

    python -m vlmrl.testing.smoke model
    python -m vlmrl.testing.smoke geo3k --output DIR [--train 8 --test 4]     # prints DIR
    python -m vlmrl.testing.smoke grounding --output DIR [--train 8 --val 4]  # prints DIR/train.jsonl DIR/val.jsonl
    python -m vlmrl.testing.smoke overrides                                    # the scale-down overrides, one a line
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

OVERRIDES = (
    "trainer.device=cpu",
    "trainer.cpu_workers=2",
    "trainer.total_training_steps=2",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "data.max_response_length=48",
    "data.val_max_samples=4",
    "actor_rollout_ref.rollout.enforce_eager=True",
)
"""The scale-down: 2 CPU workers, 2 steps of 4 prompts (two optimizer steps of 2 each, as the GPU recipes take
several per batch), responses of at most 48 tokens (a random tiny model rarely stops on its own), 4 validation
prompts, and the engines eager: the GPU recipes' ``enforce_eager=False`` has vLLM compile the model at each engine
start, on a CPU ~30 s (~12 s with vLLM's compile cache warm) against ~2 s eager, for a tiny model that a compiled
engine does not speed up. Sampling (n, temperature), micro-batch caps, KL, LoRA, checkpointing and validation
settings are left alone."""


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _triangle(rng: random.Random, size: int = 112) -> tuple[Image.Image, int, int]:
    """A triangle with two angles written beside it; returns the image and the two angles."""
    a, b = rng.randint(25, 80), rng.randint(25, 80)
    im = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(im)
    pts = [(10, size - 12), (size - 10, size - 12), (rng.randint(25, size - 25), 14)]
    d.polygon(pts, outline=(0, 0, 0))
    d.text((4, size - 11), f"{a}", fill=(200, 0, 0))
    d.text((size - 22, size - 11), f"{b}", fill=(200, 0, 0))
    d.text((pts[2][0] - 2, 2), "x", fill=(0, 0, 200))
    return im, a, b


def geo3k_source(out_dir: str | Path, train: int = 8, test: int = 4, seed: int = 0) -> Path:
    """A stand-in of ``hiyouga/geometry3k`` in its hub layout (what ``preprocess/geo3k.py --input`` reads)."""
    import datasets

    out = Path(out_dir)
    features = datasets.Features(
        {
            "images": datasets.List(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
        }
    )
    rng = random.Random(seed)
    for split, n in (("train", train), ("test", test)):
        rows = {"images": [], "problem": [], "answer": []}
        for i in range(n):
            im, a, b = _triangle(rng)
            rows["images"].append([{"bytes": _png(im), "path": f"{split}_{i}.png"}])
            rows["problem"].append(f"<image>Two angles of the triangle are {a}° and {b}°. Find x.")
            rows["answer"].append(str(180 - a - b))
        (out / "data").mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows, features=features).to_parquet(
            str(out / "data" / f"{split}-00000-of-00001.parquet")
        )
    return out


def grounding_source(out_dir: str | Path, train: int = 8, val: int = 4, seed: int = 0) -> tuple[Path, Path]:
    """JSONL records in ``examples/grounding.sh``'s format (``image``, ``question``, ``bbox`` in original pixels),
    with their images in ``out_dir/images``."""
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    colours = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 40)}
    files = []
    for split, n in (("train", train), ("val", val)):
        lines = []
        for i in range(n):
            w, h = rng.choice([(160, 120), (120, 160), (140, 140)])
            name = rng.choice(list(colours))
            x1, y1 = rng.randint(0, w - 40), rng.randint(0, h - 40)
            box = [x1, y1, x1 + rng.randint(20, 40), y1 + rng.randint(20, 40)]
            im = Image.new("RGB", (w, h), (245, 245, 245))
            ImageDraw.Draw(im).rectangle(box, fill=colours[name])
            rel = f"images/{split}_{i:03d}.png"
            im.save(out / rel)
            lines.append(json.dumps({"image": rel, "question": f"Where is the {name} square?", "bbox": box}))
        path = out / f"{split}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files.append(path)
    return files[0], files[1]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m vlmrl.testing.smoke", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model", help="print the tiny model's folder (built on first use)")
    m.add_argument("--family", choices=list(FAMILY_SPECS), default="qwen2_5_vl", help="its model family")
    sub.add_parser("overrides", help="print the scale-down overrides, one per line")
    g = sub.add_parser("geo3k", help="write a Geometry3K stand-in in its hub layout")
    g.add_argument("--output", required=True)
    g.add_argument("--train", type=int, default=8)
    g.add_argument("--test", type=int, default=4)
    r = sub.add_parser("grounding", help="write grounding JSONL records with images")
    r.add_argument("--output", required=True)
    r.add_argument("--train", type=int, default=8)
    r.add_argument("--val", type=int, default=4)
    a = ap.parse_args(argv)
    if a.what == "model":
        print(ensure_tiny_model(seed=0, spec=FAMILY_SPECS[a.family]))
    elif a.what == "overrides":
        print("\n".join(OVERRIDES))
    elif a.what == "geo3k":
        print(geo3k_source(a.output, a.train, a.test))
    else:
        print(*grounding_source(a.output, a.train, a.val))
    return 0


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    sys.exit(main())
