"""Preprocess scripts: verl's record schema, every rejection reason, --strict, determinism, multi-image, synthetic
task families."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlmrl.preprocess import common, geo3k, jsonl, synthetic

ROOT = Path(__file__).resolve().parents[1]


def png(colour: tuple[int, int, int] | str = "red", size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def jpeg(seed: int = 0, size: tuple[int, int] = (48, 32)) -> bytes:
    rnd = random.Random(seed)
    im = Image.new("RGB", size, tuple(rnd.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def rejects(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------- geo3k inputs


def geo3k_dataset_dict(bad: bool = False):
    """A small local dataset in the Geometry3K format (columns images, problem, answer; three splits)."""
    import datasets

    feats = datasets.Features(
        {
            "images": datasets.List(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
        }
    )

    def split(n: int, offset: int) -> datasets.Dataset:
        data = {
            "images": [[{"bytes": jpeg(offset + i), "path": None}] for i in range(n)],
            "problem": [f"<image>Find x in triangle {offset + i}." for i in range(n)],
            "answer": [str(offset + i) for i in range(n)],
        }
        if bad:  # rows 1..3 of every split are broken in three different ways
            data["images"][1] = [{"bytes": b"not an image", "path": None}]
            data["answer"][2] = " "
            data["problem"][3] = "Find y (no placeholder)."
        return datasets.Dataset.from_dict(data, features=feats)

    return datasets.DatasetDict({"train": split(6, 0), "validation": split(4, 100), "test": split(5, 200)})


def verl_map_output(dd, split: str, out: Path) -> Path:
    """What verl's examples/data_preprocess/geo3k.py writes (its process_fn, run through datasets.map)."""

    def process_fn(example, idx):
        problem = example.pop("problem")
        prompt = problem + " " + common.INSTRUCTION_FOLLOWING
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

    dd[split].map(function=process_fn, with_indices=True).to_parquet(str(out))
    return out


def test_geo3k_from_save_to_disk_matches_verl_schema(tmp_path):
    dd = geo3k_dataset_dict()
    dd.save_to_disk(str(tmp_path / "src"))
    out = tmp_path / "out"
    report = geo3k.main(["--input", str(tmp_path / "src"), "--output-dir", str(out), "--no-progress"])
    assert report["splits"]["train"]["written"] == 6 and report["splits"]["test"]["written"] == 5
    assert not (out / "validation.parquet").exists()

    ours = pq.read_schema(out / "train.parquet")
    verl = pq.read_schema(verl_map_output(dd, "train", tmp_path / "verl.parquet"))
    assert {n: ours.field(n).type for n in ours.names} == {n: verl.field(n).type for n in verl.names}
    hf = lambda s: json.loads(s.metadata[b"huggingface"])["info"]["features"]  # noqa: E731
    assert hf(ours) == hf(verl)  # datasets decodes both the same way (images as a list of Image)

    ours_rows, verl_rows = rows(out / "train.parquet"), rows(tmp_path / "verl.parquet")
    for a, b in zip(ours_rows, verl_rows):
        a_img, b_img = a.pop("images"), b.pop("images")
        assert a == b  # every non-image field byte-for-byte equal
        # we keep the source bytes (no decode + re-encode); the pixels are the same image
        assert (
            a_img[0]["bytes"]
            == dd["train"].with_format("arrow")[a["extra_info"]["index"]]["images"][0].as_py()[0]["bytes"]
        )
        assert Image.open(io.BytesIO(a_img[0]["bytes"])).size == Image.open(io.BytesIO(b_img[0]["bytes"])).size
    assert ours_rows[0]["prompt"][0]["content"].endswith(r"MUST BE put in \boxed{}.")


def test_geo3k_from_parquet_files_and_splits(tmp_path):
    dd = geo3k_dataset_dict()
    for name, ds in dd.items():
        ds.to_parquet(str(tmp_path / "src" / "data" / f"{name}-00000-of-00001.parquet"))
    out = tmp_path / "out"
    geo3k.main(
        [
            "--input",
            str(tmp_path / "src"),
            "--output-dir",
            str(out),
            "--splits",
            "train,validation,test",
            "--no-progress",
        ]
    )
    assert [len(rows(out / f"{s}.parquet")) for s in ("train", "validation", "test")] == [6, 4, 5]
    assert rows(out / "validation.parquet")[0]["extra_info"]["split"] == "validation"
    # --store-paths: bytes-only sources are written beside the output and referenced relative to it
    geo3k.main(
        ["--input", str(tmp_path / "src"), "--output-dir", str(tmp_path / "p"), "--store-paths", "--no-progress"]
    )
    first = rows(tmp_path / "p" / "train.parquet")[0]["images"][0]
    assert first["bytes"] is None and first["path"] == "images/train/0000000_0.jpg"
    assert (tmp_path / "p" / first["path"]).read_bytes() == jpeg(0)  # the source encoding, untouched


def test_geo3k_rejects_and_num_proc_give_identical_output(tmp_path):
    dd = geo3k_dataset_dict(bad=True)
    dd.save_to_disk(str(tmp_path / "src"))
    a, b = tmp_path / "a", tmp_path / "b"
    geo3k.main(["--input", str(tmp_path / "src"), "--output-dir", str(a), "--no-progress"])
    rep = geo3k.main(["--input", str(tmp_path / "src"), "--output-dir", str(b), "--num-proc", "2", "--no-progress"])
    assert (a / "train.parquet").read_bytes() == (b / "train.parquet").read_bytes()
    assert rep["splits"]["train"]["rejected_by_reason"] == {
        "corrupt_image": 1,
        "empty_answer": 1,
        "image_count_mismatch": 1,
    }
    rej = rejects(b)
    assert [(r["split"], r["reason"]) for r in rej][:3] == [
        ("train", "corrupt_image"),
        ("train", "empty_answer"),
        ("train", "image_count_mismatch"),
    ]
    assert rej[0]["source"].endswith("[train] row 1")
    assert [r["extra_info"]["index"] for r in rows(b / "train.parquet")] == [0, 4, 5]  # source indices kept


def test_geo3k_hub_unreachable_says_so(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(common.PreprocessError, match="Hugging Face Hub.*--input DIR"):
        geo3k.main(["--input", "someone/geometry-nowhere", "--output-dir", str(tmp_path / "o")])
    with pytest.raises(common.PreprocessError, match="no such file or folder"):
        geo3k.main(["--input", str(tmp_path / "missing_dir/"), "--output-dir", str(tmp_path / "o")])


# ------------------------------------------------------------------------------------------------- jsonl


def write_jsonl_fixture(tmp_path: Path) -> tuple[Path, Path]:
    """One good multi-image record, one good single-image record with a box, then one row per reject reason."""
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "a.png").write_bytes(png("red"))
    (img / "b.jpg").write_bytes(jpeg(1))
    (img / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    (img / "big.png").write_bytes(png("blue", (80, 80)))
    (img / "thin.png").write_bytes(png("blue", (300, 1)))
    (img / "huge.png").write_bytes(png("blue", (40, 30)) + b"\0" * 5000)  # over --max-image-bytes 4000
    (tmp_path / "outside.png").write_bytes(png("red"))
    recs = [
        {"question": "<image>Left, <image>right: same colour?", "answer": "no", "images": ["a.png", "b.jpg"]},
        {"question": "<image>Where is it?", "answer": [1, 2, 3, 4], "images": "a.png", "boxes": [1, 2, 3, 4]},
        {"question": "<image>Q?", "images": ["a.png"]},  # missing_field (answer)
        {"question": "  ", "answer": "x", "images": []},  # empty_question
        {"question": "<image>Q?", "answer": "", "images": ["a.png"]},  # empty_answer
        {"question": "<image>Q?", "answer": "x", "images": ["nope.png"]},  # unreadable_image
        {"question": "<image>Q?", "answer": "x", "images": ["corrupt.png"]},  # corrupt_image
        {"question": "<image>Q?", "answer": "x", "images": ["big.png"]},  # image_too_large (guard lowered)
        {"question": "<image>Q?", "answer": "x", "images": ["thin.png"]},  # bad_aspect_ratio
        {"question": "<image><image>Q?", "answer": "x", "images": ["a.png"]},  # image_count_mismatch
        {"question": "<image>Q?", "answer": "x", "images": ["../outside.png"]},  # image_outside_dir
        {"question": "<image>Q?", "answer": "x", "images": ["huge.png"]},  # image_file_too_large
    ]
    lines = [json.dumps(r) for r in recs] + ["{not json"]  # invalid_record
    lines.insert(1, "")  # blank lines are not records
    src = tmp_path / "records.jsonl"
    src.write_text("\n".join(lines) + "\n")
    return src, img


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_jsonl_every_reject_reason_and_multi_image(tmp_path, monkeypatch):
    src, img = write_jsonl_fixture(tmp_path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 80x80 = 6400 > 2 * 1000: Pillow refuses it
    out = tmp_path / "out"
    report = jsonl.main(
        [
            "--input",
            str(src),
            "--image-dir",
            str(img),
            "--output-dir",
            str(out),
            "--no-progress",
            "--max-image-bytes",
            "4000",
        ]
    )
    got = {r["reason"]: r["source"] for r in rejects(out)}
    assert set(got) == set(common.REJECT_REASONS)  # every reason is produced by some row
    assert got["missing_field"] == f"{src}:4"  # line numbers count the blank line
    assert got["invalid_record"] == f"{src}:14"
    assert report["splits"]["train"]["written"] == 2
    assert report["splits"]["train"]["rejected"] == len(common.REJECT_REASONS)
    saved = json.loads((out / "report.json").read_text())
    assert saved["splits"]["train"]["rejected_by_reason"] == {k: 1 for k in sorted(common.REJECT_REASONS)}

    first, second = rows(out / "train.parquet")
    assert len(first["images"]) == 2 and first["prompt"][0]["content"].count("<image>") == 2
    assert first["images"][0]["bytes"] == (img / "a.png").read_bytes()  # source encoding kept
    assert first["images"][1]["bytes"] == (img / "b.jpg").read_bytes()
    assert first["images"][1]["path"] == "b.jpg"
    assert second["reward_model"] == {"style": "rule", "ground_truth": "[1, 2, 3, 4]"}
    assert second["extra_info"]["boxes"] == [[1.0, 2.0, 3.0, 4.0]]
    assert second["data_source"] == "jsonl/records"


def test_strict_stops_at_first_bad_row_naming_it(tmp_path):
    src, img = write_jsonl_fixture(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(common.PreprocessError, match=r"records\.jsonl:4: rejected \(missing_field\)"):
        jsonl.main(
            ["--input", str(src), "--image-dir", str(img), "--output-dir", str(out), "--strict", "--no-progress"]
        )
    assert not (out / "train.parquet").exists() and not list(out.glob("*.tmp"))
    # by path from a checkout, as a shell pipeline runs it: exit status 2 and the row on stderr
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "preprocess" / "jsonl.py"),
            "--input",
            str(src),
            "--image-dir",
            str(img),
            "--output-dir",
            str(out),
            "--strict",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "records.jsonl:4" in proc.stderr


def test_jsonl_store_paths_and_prepend_images(tmp_path):
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "a.png").write_bytes(png("green"))
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"q": "What colour?", "a": "green", "pics": ["imgs/a.png"]}) + "\n")  # no --image-dir
    out = tmp_path / "deep" / "out"
    jsonl.main(
        [
            "--input",
            str(src),
            "--output-dir",
            str(out),
            "--store-paths",
            "--prepend-images",
            "--split",
            "val",
            "--question-field",
            "q",
            "--answer-field",
            "a",
            "--images-field",
            "pics",
            "--no-progress",
        ]
    )
    (rec,) = rows(out / "val.parquet")
    assert rec["prompt"][0]["content"] == "<image>What colour?"
    assert rec["images"][0]["bytes"] is None
    # an image outside the output folder is linked into it: the dataset reads paths only inside the parquet's folder
    stored = out / rec["images"][0]["path"]
    assert stored.resolve().is_relative_to(out.resolve()) and stored.read_bytes() == (img / "a.png").read_bytes()
    assert stored.stat().st_ino == (img / "a.png").stat().st_ino  # a hard link on one file system: no copy


def test_jsonl_keeps_verls_tools_kwargs_for_multi_turn_rollouts(tmp_path, tiny_processor):
    """A line's ``tools_kwargs`` / ``interaction_kwargs`` land in ``extra_info`` as verl's multi-turn preprocessing
    writes them (one struct type over the file; a key a line lacks is null), the dataset hands them to the rollout,
    and a line whose ``tools_kwargs`` is not an object is a counted reject."""
    from vlmrl.config.schema import DataConfig
    from vlmrl.data.dataset import RLDataset

    (tmp_path / "a.png").write_bytes(png("green"))
    lines = [
        {
            "question": "<image>Check 12.",
            "answer": "12",
            "images": ["a.png"],
            "tools_kwargs": {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "12"}}},
            "interaction_kwargs": {"name": "geo3k", "query": "q"},
        },
        {
            "question": "<image>Zoom.",
            "answer": "green",
            "images": ["a.png"],
            "tools_kwargs": {"image_zoom": {"create_kwargs": {"min_size": 56}}},
        },
        {"question": "<image>No tools.", "answer": "x", "images": ["a.png"]},
        {"question": "<image>Bad.", "answer": "x", "images": ["a.png"], "tools_kwargs": ["not", "an", "object"]},
    ]
    src = tmp_path / "tools.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    report = jsonl.main(["--input", str(src), "--output-dir", str(out), "--no-progress"])
    assert report["splits"]["train"]["written"] == 3 and rejects(out)[0]["source"] == f"{src}:4"
    assert "tools_kwargs must be an object" in rejects(out)[0]["detail"]
    recs = rows(out / "train.parquet")
    assert recs[0]["extra_info"]["tools_kwargs"] == {
        "calc_geo3k_reward": {"create_kwargs": {"ground_truth": "12"}},
        "image_zoom": None,
    }
    assert recs[1]["extra_info"]["tools_kwargs"]["image_zoom"] == {"create_kwargs": {"min_size": 56}}
    assert (
        recs[2]["extra_info"]["tools_kwargs"] is None and recs[0]["extra_info"]["interaction_kwargs"]["name"] == "geo3k"
    )
    ds = RLDataset(str(out / "train.parquet"), tiny_processor, DataConfig(train_files="x"), verbose=False)
    assert ds[0].extra_info["tools_kwargs"]["calc_geo3k_reward"]["create_kwargs"] == {"ground_truth": "12"}


# ------------------------------------------------------------------------------------------------- synthetic


def test_synthetic_deterministic_bytes_any_num_proc(tmp_path):
    args = [
        "--families",
        "colour,shape,count,position,grounding",
        "--train-size",
        "60",
        "--test-size",
        "10",
        "--seed",
        "3",
        "--no-progress",
    ]
    synthetic.main([*args, "--output-dir", str(tmp_path / "a")])
    synthetic.main([*args, "--output-dir", str(tmp_path / "b"), "--num-proc", "2", "--row-group-size", "100"])
    synthetic.main([*args[:-2], "4", "--no-progress", "--output-dir", str(tmp_path / "c")])
    for split in ("train", "test"):
        assert (tmp_path / "a" / f"{split}.parquet").read_bytes() == (tmp_path / "b" / f"{split}.parquet").read_bytes()
    assert (tmp_path / "a" / "train.parquet").read_bytes() != (tmp_path / "c" / "train.parquet").read_bytes()
    assert rejects(tmp_path / "a") == []


def _decode(rec: dict) -> Image.Image:
    return Image.open(io.BytesIO(rec["images"][0]["bytes"])).convert("RGB")


def test_synthetic_colour_family_is_image_only_signal_and_balanced(tmp_path):
    synthetic.main(["--output-dir", str(tmp_path), "--train-size", "31", "--test-size", "0", "--no-progress"])
    recs = rows(tmp_path / "train.parquet")
    assert {r["prompt"][0]["content"] for r in recs} == {synthetic.QUESTIONS["colour"]}  # text carries no signal
    counts = {c: sum(r["reward_model"]["ground_truth"] == c for r in recs) for c in ("red", "green", "blue")}
    assert max(counts.values()) - min(counts.values()) <= 1
    for r in recs:
        im = _decode(r)
        assert im.size == (56, 56)
        colours = im.getcolors(56 * 56)
        top = max(c for c in colours if c[1] != (255, 255, 255))
        assert top[1] == synthetic.PALETTE[r["reward_model"]["ground_truth"]]
        assert top[0] > 0.45 * 56 * 56  # one large shape: most of the canvas
        assert r["data_source"] == "synthetic/colour" and r["extra_info"]["choices"] == ["red", "green", "blue"]


def test_synthetic_families_answers_match_pictures(tmp_path):
    synthetic.main(
        [
            "--output-dir",
            str(tmp_path),
            "--families",
            "shape,count,position,grounding",
            "--image-size",
            "96x80",
            "--train-size",
            "80",
            "--test-size",
            "0",
            "--no-progress",
        ]
    )
    recs = rows(tmp_path / "train.parquet")
    by = {}
    for r in recs:
        by.setdefault(r["data_source"], []).append(r)
    assert set(by) == {f"synthetic/{f}" for f in ("shape", "count", "position", "grounding")}
    for r in recs:
        objs, gt = r["extra_info"]["objects"], r["reward_model"]["ground_truth"]
        im = _decode(r)
        assert im.size == (96, 80)
        for o in objs:
            x1, y1, x2, y2 = o["box"]
            assert 0 <= x1 < x2 < 96 and 0 <= y1 < y2 < 80
            assert im.getpixel(((x1 + x2) // 2, (y1 + y2) // 2)) == synthetic.PALETTE[o["colour"]]
        fam = r["data_source"].split("/")[1]
        if fam == "shape":
            assert gt == objs[0]["shape"] and gt in r["extra_info"]["choices"]
        elif fam == "count":
            assert gt == str(len(objs))
        elif fam == "position":
            a, b = (o["box"] for o in objs)
            expect = {"left": a[2] < b[0], "right": a[0] > b[2], "top": a[3] < b[1], "bottom": a[1] > b[3]}
            assert expect[gt], (gt, a, b)
        else:
            assert json.loads(gt) == objs[0]["box"]
            target = f"{objs[0]['colour']} {objs[0]['shape']}"
            assert target in r["prompt"][0]["content"]
            assert all(f"{o['colour']} {o['shape']}" != target for o in objs[1:])  # the target is unambiguous


def test_synthetic_zoom_family_hides_the_square_from_a_small_pixel_budget(tmp_path):
    """The zoom family: a small square of the answer's colour near the centre of a large canvas strewn with dots of
    every colour; the dots never touch it; the box the demo's warm start zooms into (the centre, in the pixels of the
    112 x 112 image the tiny model sees) holds the whole square; shown at that budget it is a few pixels."""
    from vlmrl.models import qwen_vl

    sys.path.insert(0, str(ROOT / "examples" / "tool_zoom"))
    from teacher import CENTRE

    synthetic.main(
        [
            "--output-dir",
            str(tmp_path),
            "--families",
            "zoom",
            "--image-size",
            "896",
            "--train-size",
            "12",
            "--test-size",
            "0",
            "--no-progress",
        ]
    )
    for r in rows(tmp_path / "train.parquet"):
        im, gt = _decode(r), r["reward_model"]["ground_truth"]
        (obj,) = r["extra_info"]["objects"]
        x1, y1, x2, y2 = obj["box"]
        assert r["data_source"] == "synthetic/zoom" and obj["colour"] == gt and x2 - x1 + 1 == 896 // 36
        square = im.crop((x1, y1, x2 + 1, y2 + 1))
        assert square.getcolors() == [((x2 - x1 + 1) * (y2 - y1 + 1), synthetic.PALETTE[gt])]  # nothing on it
        ring = im.crop((x1 - 2, y1 - 2, x2 + 3, y2 + 3)).getcolors(10**4)
        assert {c for _, c in ring} == {synthetic.PALETTE[gt], (255, 255, 255)}  # no dot touches it
        counts = {c: n for n, c in im.getcolors(896 * 896)}
        assert all(counts[synthetic.PALETTE[c]] > 0.03 * 896 * 896 for c in ("red", "green", "blue"))  # the dots
        scale = 896 / 112
        assert all(c * scale <= v <= (c + 6) * scale for c, v in zip(CENTRE[:2], (x1, y1)))
        assert x2 < CENTRE[2] * scale and y2 < CENTRE[3] * scale
        small = qwen_vl.resize_image(im, 28, 28 * 28 * 4, 28 * 28 * 16)
        assert small.size == (112, 112) and (x2 - x1) / scale < 4  # three pixels at the tiny model's budget


def test_synthetic_runs_by_path_from_a_checkout(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "preprocess" / "synthetic.py"),
            "--output-dir",
            str(tmp_path),
            "--train-size",
            "8",
            "--test-size",
            "4",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "train" in proc.stdout and len(rows(tmp_path / "test.parquet")) == 4
