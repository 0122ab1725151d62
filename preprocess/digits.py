"""Real images without a download: scikit-learn's handwritten digits → parquet in verl's record schema.

The source is ``sklearn.datasets.load_digits``: the 1,797 scans of the test set of the UCI "optical recognition of
handwritten digits" data (written by 13 people; 32x32 bitmaps counted into 8x8 blocks of 17 grey levels), shipped
inside scikit-learn's wheel, so it installs from the package registry and reads offline. Each scan is drawn dark on
white and enlarged without smoothing (``--image-size``, default 56: 7x7 pixels a block); the question is the same
for every record ("Which digit is written in the image?"), so the image is the only signal; the answer is the digit
and ``extra_info.choices`` lists the ten (the ``synthetic`` reward's label rule: 1.0 when the answer names exactly
one digit and it is the right one).

Three splits of one seeded, stratified shuffle of the whole set (each class within a record or two of its share):
``warm`` (``--warm-size``, default 200: the small labelled part a supervised warm start imitates), ``test``
(``--test-size``, default 360: held out) and ``train`` (the rest, 1,237 by default: the RL prompts, whose labels
only the reward reads). The data does not say who wrote which scan, so the splits share writers.

    python preprocess/digits.py --output-dir data/digits [--image-size 56] [--warm-size 200] [--test-size 360]
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vlmrl.preprocess.common import (
    PreprocessError,
    build_record,
    check_image,
    check_placeholders,
    encode_pil,
    image_struct,
    record_features,
)
from vlmrl.preprocess.pipeline import Item, SplitResult, add_common_args, cli_main, run_split, write_report

DATA_SOURCE = "sklearn/digits"
QUESTION = "<image>Which digit is written in the image?"
CHOICES = [str(d) for d in range(10)]
LEVELS = 16
"""The scans' darkest grey level (0 is blank paper)."""


@dataclass(frozen=True)
class Scan:
    """One source scan: its row in ``load_digits`` and the split it goes to."""

    split: str
    index: int
    row: int


def load_scans() -> tuple[Any, Any]:
    """``load_digits``' images [1797, 8, 8] (0..16) and labels [1797], or a PreprocessError naming what to install."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise PreprocessError(
            f"preprocess/digits.py reads scikit-learn's digits: pip install scikit-learn ({e})"
        ) from None
    d = load_digits()
    return d.images, d.target


def split_rows(labels: Sequence[int], warm: int, test: int, seed: int) -> dict[str, list[int]]:
    """``warm``, ``test`` and ``train`` (the rest) rows, stratified: the rows shuffled (seeded with ``seed``), then
    ordered by each row's place within its class (k-th of m: (k + 0.5) / m), so any first rows hold each class within
    one record of its share."""
    n = len(labels)
    if warm < 0 or test < 0 or warm + test >= n:
        raise PreprocessError(f"--warm-size {warm} + --test-size {test} must leave training rows of the {n} scans")
    rows = list(range(n))
    random.Random(f"digits:{seed}").shuffle(rows)
    by_class: dict[int, list[int]] = {}
    for r in rows:
        by_class.setdefault(int(labels[r]), []).append(r)
    place = {r: (k + 0.5) / len(rs) for rs in by_class.values() for k, r in enumerate(rs)}
    rows.sort(key=lambda r: (place[r], int(labels[r])))
    return {"warm": rows[:warm], "test": rows[warm : warm + test], "train": rows[warm + test :]}


def render(scan: Any, size: int) -> Image.Image:
    """An 8x8 scan (0 = paper .. 16 = ink) as a ``size`` x ``size`` RGB image, dark on white, blocks kept sharp."""
    grey = Image.new("L", (8, 8))
    grey.putdata([255 - round(float(v) * 255 / LEVELS) for v in scan.reshape(-1)])
    return grey.resize((size, size), Image.Resampling.NEAREST).convert("RGB")


def build_scan(scan: Scan, images: Any, labels: Any, size: int, store_paths: bool, output_dir: str) -> dict[str, Any]:
    """One record (runs in a worker)."""
    checked = check_image(encode_pil(render(images[scan.row], size)))
    check_placeholders(QUESTION, 1)
    img = image_struct(
        checked,
        source_path=None,
        source_name=f"digits/{scan.row:04d}.png",
        store_paths=store_paths,
        output_dir=output_dir,
        spill_name=f"{scan.split}/{scan.index:07d}_0",
    )
    return build_record(
        data_source=DATA_SOURCE,
        question=QUESTION,
        answer=str(int(labels[scan.row])),
        images=[img],
        split=scan.split,
        index=scan.index,
        ability="visual",
        extra_info={"choices": CHOICES, "source_row": scan.row},
    )


def generate(
    output_dir: str | Path,
    *,
    image_size: int = 56,
    warm_size: int = 200,
    test_size: int = 360,
    seed: int = 0,
    num_proc: int = 1,
    store_paths: bool = False,
    strict: bool = False,
    progress: bool = True,
    row_group_size: int = 100,
    quiet: bool = False,
) -> dict[str, Any]:
    """Write ``output_dir/{warm,train,test}.parquet``; returns the report."""
    import datasets

    if image_size < 8:
        raise PreprocessError(f"--image-size {image_size}: at least 8 (one pixel a block)")
    started = time.perf_counter()
    images, labels = load_scans()
    features = record_features(
        {"choices": datasets.List(datasets.Value("string")), "source_row": datasets.Value("int64")}
    )
    build = functools.partial(
        build_scan, images=images, labels=labels, size=image_size, store_paths=store_paths, output_dir=str(output_dir)
    )
    results: list[SplitResult] = []
    for split, rows in split_rows(labels, warm_size, test_size, seed).items():
        if not rows:
            continue
        scans = [Scan(split, i, r) for i, r in enumerate(rows)]
        items = (Item(f"digits {split} index {s.index} (scan {s.row})", s) for s in scans)
        results.append(
            run_split(
                split,
                items,
                build,
                Path(output_dir) / f"{split}.parquet",
                features,
                total=len(scans),
                num_proc=num_proc,
                strict=strict,
                progress=progress,
                row_group_size=row_group_size,
            )
        )
    config = {"image_size": image_size, "warm_size": warm_size, "test_size": test_size, "seed": seed}
    return write_report(output_dir, results, name="digits", config=config, started=started, quiet=quiet)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--image-size", type=int, default=56, help="width and height in pixels (default 56)")
    p.add_argument("--warm-size", type=int, default=200, help="records in warm.parquet (the labelled part)")
    p.add_argument("--test-size", type=int, default=360, help="records in test.parquet (held out)")
    p.add_argument("--seed", type=int, default=0, help="the split's shuffle")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point: parse flags, write the splits, report."""
    a = parse_args(argv)
    return generate(
        a.output_dir,
        image_size=a.image_size,
        warm_size=a.warm_size,
        test_size=a.test_size,
        seed=a.seed,
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
