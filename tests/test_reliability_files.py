"""Files a careless or hostile dataset names, and runs that must not lose good output or hang:

* image paths stay inside their folder (``--image-dir`` for preprocessing, the parquet file's folder for training),
  are read only when they are regular files, and only up to a size cap: ``/dev/zero`` does not fill memory, a FIFO
  does not hang, ``../`` and symlinks out of the folder are refused, each with the row;
* a preprocessing run that writes nothing (empty input, every row rejected) exits non-zero and leaves the old parquet
  as it was; a pool worker killed mid-run ends the run with an error, not a wait;
* an image that passes preprocessing at the training's pixel bounds never fails later in ``ds[i]``: the same resize
  check runs in both, and the dataset drops (and names) images its own bounds cannot take;
* a validation set that filters to nothing, or an image key naming a column that holds no images, is reported before
  anything starts, naming the file and key.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlmrl.config import ConfigError, DataConfig, load
from vlmrl.data import DataError, RLDataset
from vlmrl.preprocess import common, jsonl, pipeline

REPO = Path(__file__).resolve().parents[1]


def png(size: tuple[int, int] = (40, 30), colour: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def hostile_folder(tmp_path: Path) -> Path:
    """An image folder holding a good image and every kind of bad path a dataset could name."""
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "good.png").write_bytes(png())
    os.mkfifo(img / "fifo.png")  # opening it for reading would block forever
    (img / "zero.png").symlink_to("/dev/zero")  # endless bytes
    (img / "escape.png").symlink_to(tmp_path / "secret.png")
    (tmp_path / "secret.png").write_bytes(png(colour="blue"))
    (img / "folder.png").mkdir()
    return img


BAD_PATHS = {
    "/dev/zero": "image_outside_dir",
    "../secret.png": "image_outside_dir",
    "escape.png": "image_outside_dir",  # a symlink out of the folder
    "zero.png": "image_outside_dir",  # a symlink to a device
    "fifo.png": "unreadable_image",  # not a regular file: never opened
    "folder.png": "unreadable_image",
}


@pytest.mark.timeout(120)
def test_preprocessing_reads_only_regular_files_inside_the_image_dir(tmp_path: Path) -> None:
    img = hostile_folder(tmp_path)
    lines = [{"question": "<image>Q?", "answer": "a", "images": ["good.png"]}]
    lines += [{"question": "<image>Q?", "answer": "a", "images": [p]} for p in BAD_PATHS]
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    t0 = time.monotonic()
    report = jsonl.main(
        ["--input", str(src), "--image-dir", str(img), "--output-dir", str(tmp_path / "out"), "--no-progress"]
    )
    assert time.monotonic() - t0 < 60
    assert report["splits"]["train"]["written"] == 1
    rejected = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    got = {r["source"]: r["reason"] for r in rejected}
    assert got == {f"{src}:{i + 2}": reason for i, reason in enumerate(BAD_PATHS.values())}
    assert all(p in json.dumps(rejected) for p in BAD_PATHS)  # each reject names its path


@pytest.mark.timeout(120)
def test_training_reads_only_regular_files_inside_the_parquet_folder(tmp_path: Path, tiny_processor) -> None:
    img = hostile_folder(tmp_path)
    for k, (bad, _) in enumerate(BAD_PATHS.items()):
        rows = [
            {
                "data_source": "d",
                "prompt": [{"role": "user", "content": "<image>Q?"}],
                "images": [{"bytes": None, "path": p}],
                "reward_model": {"style": "rule", "ground_truth": "a"},
                "extra_info": {"index": i},
            }
            for i, p in enumerate(["good.png", bad])
        ]
        path = img / f"data{k}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        t0 = time.monotonic()
        with pytest.raises(DataError, match=rf"^{path} row 1: image 0: ") as e:
            RLDataset(str(path), tiny_processor, DataConfig(max_prompt_length=4096), verbose=False)
        assert time.monotonic() - t0 < 30, bad
        assert ("leaves the data folder" in str(e.value)) == (BAD_PATHS[bad] == "image_outside_dir"), str(e.value)


@pytest.mark.slow  # (10.4 s in the clean clone's run of 2da2a8a: over the contributor tier's 10 s a test)
def test_preprocessing_never_replaces_a_good_parquet_with_an_empty_one(tmp_path: Path) -> None:
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "a.png").write_bytes(png())
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "<image>Q?", "answer": "a", "images": ["a.png"]}) + "\n")
    out = tmp_path / "out"
    jsonl.main(["--input", str(good), "--image-dir", str(img), "--output-dir", str(out), "--no-progress"])
    before = (out / "train.parquet").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "<image>Q?", "answer": "a", "images": ["missing.png"]}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for source, why in ((bad, "all 1 rows were rejected"), (empty, "no rows")):
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "preprocess" / "jsonl.py"),
                "--input",
                str(source),
                "--image-dir",
                str(img),
                "--output-dir",
                str(out),
                "--no-progress",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr
        assert why in proc.stderr and "train.parquet was left as it was" in proc.stderr
        assert (out / "train.parquet").read_bytes() == before
    assert not list(out.glob("*.tmp"))


def _die_on_fifth(payload: int) -> dict:
    """A record builder whose fifth call kills its own process, as the OOM killer would."""
    if payload == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return {
        "data_source": "d",
        "prompt": [{"role": "user", "content": "Q"}],
        "images": [],
        "ability": "a",
        "reward_model": {"style": "rule", "ground_truth": "a"},
        "extra_info": {"split": "train", "index": payload, "answer": "a", "question": "Q"},
    }


@pytest.mark.timeout(120)
def test_a_killed_pool_worker_ends_the_run_with_an_error(tmp_path: Path) -> None:
    items = [pipeline.Item(f"row {i}", i) for i in range(40)]
    t0 = time.monotonic()
    with pytest.raises(common.PreprocessError, match="a preprocessing worker process died"):
        pipeline.run_split(
            "train",
            items,
            _die_on_fifth,
            tmp_path / "train.parquet",
            common.record_features(),
            num_proc=2,
            progress=False,
        )
    assert time.monotonic() - t0 < 60 and not (tmp_path / "train.parquet").exists()


def test_an_image_that_passes_preprocessing_never_fails_in_the_dataset(tmp_path: Path, tiny_processor) -> None:
    """2000x10 passes Qwen's default bounds; under max_pixels=12544 it would resize to a height of 0 (it used to
    crash ``ds[i]``): preprocessing at those bounds rejects it, the dataset at those bounds drops and names it."""
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "thin.png").write_bytes(png((2000, 10)))
    (img / "ok.png").write_bytes(png((56, 56)))
    src = tmp_path / "r.jsonl"
    src.write_text(
        "".join(
            json.dumps({"question": "<image>Q?", "answer": "a", "images": [f]}) + "\n" for f in ("ok.png", "thin.png")
        )
    )
    base = ["--input", str(src), "--image-dir", str(img), "--no-progress"]
    wide = jsonl.main([*base, "--output-dir", str(tmp_path / "default")])
    assert wide["splits"]["train"]["written"] == 2
    small = jsonl.main([*base, "--output-dir", str(tmp_path / "small"), "--max-pixels", "12544"])
    assert small["splits"]["train"]["rejected_by_reason"] == {"bad_aspect_ratio": 1}
    path = tmp_path / "default" / "train.parquet"
    ds = RLDataset(str(path), tiny_processor, DataConfig(max_prompt_length=4096, max_pixels=12544), verbose=False)
    assert len(ds) == 1 and ds.report["filtered_by_reason"] == {"unresizable_image": 1}
    assert f"{path} row 1: image 0: 2000x10 resizes to" in ds.report["first_filtered"]["unresizable_image"]
    assert "unresizable_image, e.g." in ds.format_report()
    assert ds[0].images[0].size[0] >= 28  # every kept record builds


def test_a_validation_set_that_filters_to_nothing_stops_at_start(tiny_model_dir: str, tmp_path: Path) -> None:
    from vlmrl.preprocess.synthetic import main as synthetic
    from vlmrl.trainer.grpo import Trainer

    synthetic(
        [
            "--output-dir",
            str(tmp_path),
            "--families",
            "colour",
            "--image-size",
            "56",
            "--train-size",
            "16",
            "--test-size",
            "4",
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    val = pq.read_table(tmp_path / "test.parquet").to_pylist()
    for row in val:
        row["prompt"][0]["content"] += " and more" * 200  # every validation prompt is now overlong
    pq.write_table(pa.Table.from_pylist(val), tmp_path / "long.parquet")
    cfg = load(
        [
            f"data.train_files={tmp_path / 'train.parquet'}",
            f"data.val_files={tmp_path / 'long.parquet'}",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            "trainer.launcher=inline",
        ],
        config_name="tiny_cpu",
    )
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"data.val_files: no prompt survives the overlong filter .*4 rows .* -> 0"):
        Trainer(cfg)
    assert time.monotonic() - t0 < 30 and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_image_key_naming_a_non_image_column_names_the_key_and_file(tmp_path: Path, tiny_processor) -> None:
    from vlmrl.preprocess.synthetic import main as synthetic

    synthetic(
        [
            "--output-dir",
            str(tmp_path),
            "--families",
            "colour",
            "--image-size",
            "56",
            "--train-size",
            "4",
            "--test-size",
            "1",
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    path = tmp_path / "train.parquet"
    for key in ("data_source", "ability"):
        with pytest.raises(DataError, match=rf"^{path}: data.image_key='{key}' names a column of type string"):
            RLDataset(str(path), tiny_processor, DataConfig(image_key=key), verbose=False)
