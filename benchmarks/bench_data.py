"""Data pipeline throughput: preprocessing records/s and dataset iteration records/s (decode + resize), each against a
plain ``datasets`` baseline doing the same work the way verl does it.

    python benchmarks/bench_data.py [--rows 2000] [--num-proc 1,2] [--image-size 384x256]

Source: a fabricated dataset in the Geometry3K format (``images``, ``problem``, ``answer``; PNG line drawings), saved
with ``save_to_disk``: no download.

- preprocess, ours: ``preprocess/geo3k.py`` (source bytes copied, every image fully decoded once to validate).
- preprocess, baseline: verl's ``examples/data_preprocess/geo3k.py``: ``datasets.map(process_fn, with_indices=True)``
  over decoded images (decode + re-encode), then ``to_parquet``.
- dataset, ours: ``RLDataset`` construction (render + tokenise + image headers + overlong filter), then ``ds[i]`` over
  every record (decode, RGB, resize with qwen-vl-utils' rules, chat template, prompt ids).
- dataset, baselines: the same per-record work (decode, resize, chat template, prompt ids) through ``datasets``:
  ``Dataset.map`` over the parquet, and verl's ``RLHFDataset`` access pattern (``dataframe[i]`` row by row).

Writes ``benchmarks/results/data.json`` and the ``## Data`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402


def _diagram(rng: random.Random, size: tuple[int, int]) -> bytes:
    """A PNG line drawing about as costly to decode as a Geometry3K figure."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(im)
    w, h = size
    pts = [(rng.randrange(w), rng.randrange(h)) for _ in range(6)]
    for a, b in zip(pts, pts[1:] + pts[:1]):
        d.line([a, b], fill="black", width=2)
    for x, y in pts:
        d.ellipse((x - 3, y - 3, x + 3, y + 3), outline="black")
        d.text((x + 5, y + 5), rng.choice("ABCDEFGH"), fill="black")
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def make_source(root: Path, rows: int, size: tuple[int, int]) -> Path:
    """A Geometry3K-format DatasetDict (train = ``rows``, test = rows // 10) saved with ``save_to_disk``."""
    import datasets

    rng = random.Random(0)
    feats = datasets.Features(
        {
            "images": datasets.List(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
        }
    )

    def split(n: int) -> datasets.Dataset:
        return datasets.Dataset.from_dict(
            {
                "images": [[{"bytes": _diagram(rng, size), "path": None}] for _ in range(n)],
                "problem": [
                    f"<image>In the figure, find x if angle {i} is {rng.randint(10, 170)} degrees." for i in range(n)
                ],
                "answer": [str(rng.randint(1, 99)) for _ in range(n)],
            },
            features=feats,
        )

    src = root / "geo3k_src"
    datasets.DatasetDict({"train": split(rows), "test": split(max(1, rows // 10))}).save_to_disk(str(src))
    return src


# ----------------------------------------------------------------------------------------------- preprocessing


def bench_preprocess_ours(src: Path, out: Path, num_proc: int) -> float:
    from vlmrl.preprocess import geo3k

    t = time.perf_counter()
    rep = geo3k.main(["--input", str(src), "--output-dir", str(out), "--num-proc", str(num_proc), "--no-progress"])
    dt = time.perf_counter() - t
    return sum(s["written"] for s in rep["splits"].values()) / dt


def bench_preprocess_verl(src: Path, out: Path, num_proc: int) -> float:
    """verl's examples/data_preprocess/geo3k.py, step for step (load, map with indices, to_parquet)."""
    import datasets

    from vlmrl.preprocess.common import INSTRUCTION_FOLLOWING

    t = time.perf_counter()
    dataset = datasets.load_from_disk(str(src))
    train_dataset, test_dataset = dataset["train"], dataset["test"]

    def make_map_fn(split: str):
        def process_fn(example, idx):
            problem = example.pop("problem")
            prompt = problem + " " + INSTRUCTION_FOLLOWING
            answer = example.pop("answer")
            images = example.pop("images")
            return {
                "data_source": "hiyouga/geometry3k",
                "prompt": [{"role": "user", "content": prompt}],
                "images": images,
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": idx, "answer": answer, "question": problem},
            }

        return process_fn

    np_ = num_proc if num_proc > 1 else None
    kw = {"with_indices": True, "num_proc": np_, "load_from_cache_file": False}
    train_dataset = train_dataset.map(function=make_map_fn("train"), **kw)
    test_dataset = test_dataset.map(function=make_map_fn("test"), **kw)
    out.mkdir(parents=True, exist_ok=True)
    train_dataset.to_parquet(str(out / "train.parquet"))
    test_dataset.to_parquet(str(out / "test.parquet"))
    dt = time.perf_counter() - t
    return (len(train_dataset) + len(test_dataset)) / dt


# ----------------------------------------------------------------------------------------------- dataset


def bench_dataset_ours(path: Path, processor: Any, data_cfg: Any, threads: int) -> dict[str, float]:
    from vlmrl.data import RLDataset

    t = time.perf_counter()
    ds = RLDataset(str(path), processor, data_cfg, verbose=False)
    construct = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(len(ds)):
        ds[i]
    dt = time.perf_counter() - t
    ds = RLDataset(str(path), processor, data_cfg, verbose=False)  # cold caches again
    t = time.perf_counter()
    for start in range(0, len(ds), 16):
        ds.get_batch(range(start, min(start + 16, len(ds))), num_workers=threads)
    dt_threads = time.perf_counter() - t
    n = len(ds)
    return {
        "construct_s": construct,
        "construct_rps": n / construct,
        "iter_rps": n / dt,
        "threads": threads,
        "iter_threads_rps": n / dt_threads,
    }


def _same_work(processor: Any, bounds: tuple[int, int], factor: int):
    """Per record: decode (done by datasets' Image feature), resize with qwen-vl-utils, chat template, prompt ids."""
    from vlmrl.models import qwen_vl

    def work(prompt: list[dict], images: list[Any]) -> int:
        messages = []
        for m in prompt:
            parts = [
                {"type": "image"} if s == "<image>" else {"type": "text", "text": s}
                for s in re.split("(<image>)", m["content"])
                if s
            ]
            messages.append({"role": m["role"], "content": parts})
        resized = [qwen_vl.resize_image(im, factor, *bounds) for im in images]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = processor.tokenizer.encode(text, add_special_tokens=False)
        assert len(resized) == len(images)
        return len(ids)

    return work


def bench_dataset_datasets(
    path: Path, processor: Any, bounds: tuple[int, int], factor: int, cache: Path, max_prompt_length: int
) -> dict[str, float]:
    import datasets

    work = _same_work(processor, bounds, factor)
    t = time.perf_counter()  # verl RLHFDataset construction: load_dataset("parquet"), then filter overlong prompts
    hf = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(cache))
    tok = processor.tokenizer
    hf.filter(
        lambda doc: len(tok.apply_chat_template(doc["prompt"], add_generation_prompt=True)) <= max_prompt_length,
        load_from_cache_file=False,
    )
    construct = time.perf_counter() - t

    t = time.perf_counter()
    hf.map(
        lambda ex: {"n": work(ex["prompt"], ex["images"])}, remove_columns=hf.column_names, load_from_cache_file=False
    )
    map_dt = time.perf_counter() - t

    t = time.perf_counter()
    for i in range(len(hf)):  # verl RLHFDataset.__getitem__: self.dataframe[item], then per-record processing
        row = hf[i]
        work(row["prompt"], row["images"])
    rows_dt = time.perf_counter() - t
    n = len(hf)
    return {"construct_s": construct, "construct_rps": n / construct, "map_rps": n / map_dt, "rows_rps": n / rows_dt}


# ----------------------------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    """Where the numbers were taken."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_1m_at_end": round(load[0], 2) if load else None,
    }


def versions() -> dict[str, str]:
    """Library versions that matter here."""
    import importlib.metadata as md

    out = {}
    for pkg in ("vlmrl", "datasets", "pyarrow", "pillow", "transformers", "tokenizers", "qwen-vl-utils"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "n/a"
    return out


def markdown(result: dict[str, Any]) -> str:
    """The ``## Data`` section of benchmarks/README.md."""
    c, r = result["config"], result["results"]
    pre = r["preprocess"]
    rows = [
        "## Data",
        "",
        f"`python benchmarks/bench_data.py --rows {c['rows']}` ({c['image_size'][0]}x{c['image_size'][1]} PNG figures "
        f"in the Geometry3K format, {c['rows'] + max(1, c['rows'] // 10)} records; {result['machine']['cpu_count']} "
        f"CPU cores, {result['machine']['cpu']}; load average {result['machine']['loadavg_1m_at_end']} at the end; "
        f"{result['date']}). Records per second, higher is better.",
        "",
        "| stage | vlmrl | baseline (verl's way, `datasets`) | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for np_ in c["num_proc"]:
        ours, base = pre[f"ours_np{np_}"], pre[f"verl_map_np{np_}"]
        rows.append(
            f"| preprocess geo3k, {np_} proc (ours: copy bytes + validate; verl: `map` decode + re-encode) "
            f"| {ours:,.0f} | {base:,.0f} | {ours / base:.1f}x |"
        )
    d = r["dataset"]
    construct_x = d["ours"]["construct_rps"] / d["datasets"]["construct_rps"]
    rows += [
        f"| dataset iteration: decode + resize + template + prompt ids (baseline: `Dataset.map`) "
        f"| {d['ours']['iter_rps']:,.0f} | {d['datasets']['map_rps']:,.0f} "
        f"| {d['ours']['iter_rps'] / d['datasets']['map_rps']:.1f}x |",
        f"| dataset iteration, `get_batch(16 ids, num_workers={d['ours']['threads']})` (baseline: `Dataset.map`) "
        f"| {d['ours']['iter_threads_rps']:,.0f} | {d['datasets']['map_rps']:,.0f} "
        f"| {d['ours']['iter_threads_rps'] / d['datasets']['map_rps']:.1f}x |",
        f"| dataset iteration, row by row (baseline: verl `RLHFDataset` access, `dataframe[i]`) "
        f"| {d['ours']['iter_rps']:,.0f} | {d['datasets']['rows_rps']:,.0f} "
        f"| {d['ours']['iter_rps'] / d['datasets']['rows_rps']:.1f}x |",
        "| dataset construction + overlong filter (ours: image tokens counted from headers; verl: `load_dataset` + "
        f"`filter` on text tokens only, images decoded) | {d['ours']['construct_rps']:,.0f} "
        f"| {d['datasets']['construct_rps']:,.0f} | {construct_x:.1f}x |",
        "",
        f"Pixel bounds {c['pixel_bounds'][0]}..{c['pixel_bounds'][1]} (data.min_pixels/max_pixels), tiny Qwen2.5-VL "
        "processor. Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".",
        "Raw numbers: `benchmarks/results/data.json`.",
    ]
    load, cores = result["machine"].get("loadavg_1m_at_end"), result["machine"]["cpu_count"] or 1
    if load is not None and load > 0.5 * cores:
        rows += [
            "",
            f"Caveat: other jobs shared the machine during this run (load average {load} on {cores} cores), so the "
            "parallel rows (2 processes, 2 threads) could not scale; rerun on an idle machine for those.",
        ]
    rows += [
        "",
    ]
    return "\n".join(rows)


def write_readme_section(readme: Path, section: str) -> None:
    """Replace (or add) the ``## Data`` section, leaving other sections alone."""
    text = readme.read_text() if readme.exists() else "# Benchmarks\n\n"
    pattern = re.compile(r"^## Data\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    readme.write_text(text)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every measurement, write the results file and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000, help="training records of the fabricated source")
    p.add_argument("--num-proc", default="1,2", help="comma list of process counts for preprocessing")
    p.add_argument("--image-size", default="384x256", help="WxH of the source figures")
    p.add_argument("--min-pixels", type=int, default=28 * 28 * 4)
    p.add_argument("--max-pixels", type=int, default=28 * 28 * 512)
    p.add_argument("--results", default=str(HERE / "results" / "data.json"))
    p.add_argument("--readme", default=str(HERE / "README.md"))
    a = p.parse_args(argv)
    w, h = (int(x) for x in a.image_size.lower().split("x"))
    procs = [int(x) for x in a.num_proc.split(",")]

    from transformers import AutoProcessor

    from vlmrl.config import DataConfig
    from vlmrl.models import qwen_vl
    from vlmrl.testing.tiny import ensure_tiny_model

    processor = AutoProcessor.from_pretrained(ensure_tiny_model(seed=0))
    with tempfile.TemporaryDirectory(prefix="vlmrl-bench-data-") as tmp:
        root = Path(tmp)
        src = make_source(root, a.rows, (w, h))
        pre: dict[str, float] = {}
        for np_ in procs:
            pre[f"ours_np{np_}"] = bench_preprocess_ours(src, root / f"ours{np_}", np_)
            pre[f"verl_map_np{np_}"] = bench_preprocess_verl(src, root / f"verl{np_}", np_)
            print(
                f"preprocess np={np_}: ours {pre[f'ours_np{np_}']:.0f} rec/s, verl map {pre[f'verl_map_np{np_}']:.0f}"
            )
        path = root / f"ours{procs[0]}" / "train.parquet"
        cfg = DataConfig(
            train_files=str(path), min_pixels=a.min_pixels, max_pixels=a.max_pixels, max_prompt_length=4096
        )
        bounds = qwen_vl.pixel_bounds(processor.image_processor, a.min_pixels, a.max_pixels)
        factor = qwen_vl.patch_factor(processor.image_processor)
        ours = bench_dataset_ours(path, processor, cfg, threads=max(2, os.cpu_count() or 2))
        base = bench_dataset_datasets(path, processor, bounds, factor, root / "hf_cache", cfg.max_prompt_length)
        print(
            f"dataset: ours {ours['iter_rps']:.0f} rec/s (construct {ours['construct_s']:.2f} s); "
            f"datasets.map {base['map_rps']:.0f}; rows {base['rows_rps']:.0f}"
        )
    result = {
        "benchmark": "data",
        "date": common.now(),
        **common.provenance(),
        "machine": machine(),
        "versions": versions(),
        "config": {"rows": a.rows, "image_size": [w, h], "num_proc": procs, "pixel_bounds": list(bounds)},
        "results": {
            "preprocess": pre,
            "dataset": {"ours": ours, "datasets": base},
        },
    }
    missing = common.provenance_problems(result)
    if missing:
        raise SystemExit(f"bench_data: {a.results} not written: the result does not record {', '.join(missing)}")
    Path(a.results).parent.mkdir(parents=True, exist_ok=True)
    Path(a.results).write_text(json.dumps(result, indent=2) + "\n")
    write_readme_section(Path(a.readme), markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
