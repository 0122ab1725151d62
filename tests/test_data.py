"""RLDataset and BatchSampler: verl parquet read unchanged, image placeholders, prompt ids with one pad per image,
resize once, overlong filtering with image tokens, truncation modes, errors naming file and row, determinism and
resume, bounded memory over 10k records."""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlmrl.config import DataConfig
from vlmrl.data import BatchSampler, DataError, RLDataset, build_messages, split_placeholders
from vlmrl.models import qwen_vl
from vlmrl.preprocess import jsonl, synthetic

INSTRUCTION = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    r"The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)


def png(colour="red", size=(56, 56)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


# verl's geo3k output as datasets.to_parquet writes it (column order and HF metadata included), built by hand
_HF_FEATURES = {
    "images": {"feature": {"_type": "Image"}, "_type": "List"},
    "data_source": {"dtype": "string", "_type": "Value"},
    "prompt": {
        "feature": {"role": {"dtype": "string", "_type": "Value"}, "content": {"dtype": "string", "_type": "Value"}},
        "_type": "List",
    },
    "ability": {"dtype": "string", "_type": "Value"},
    "reward_model": {
        "style": {"dtype": "string", "_type": "Value"},
        "ground_truth": {"dtype": "string", "_type": "Value"},
    },
    "extra_info": {
        "split": {"dtype": "string", "_type": "Value"},
        "index": {"dtype": "int64", "_type": "Value"},
        "answer": {"dtype": "string", "_type": "Value"},
        "question": {"dtype": "string", "_type": "Value"},
    },
}
VERL_SCHEMA = pa.schema(
    [
        ("images", pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
            ),
        ),
    ],
    metadata={"huggingface": json.dumps({"info": {"features": _HF_FEATURES}})},
)


def verl_record(problem: str, answer: str, images: list, index: int = 0) -> dict:
    """A record exactly as verl's examples/data_preprocess/geo3k.py builds it."""
    return {
        "images": images,
        "data_source": "hiyouga/geometry3k",
        "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index, "answer": answer, "question": problem},
    }


def write_verl(path: Path, records: list[dict], row_group_size: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=VERL_SCHEMA), path, row_group_size=row_group_size)
    return path


def cfg(path, **kw) -> DataConfig:
    return DataConfig(train_files=str(path), **kw)


def img(b: bytes) -> list[dict]:
    return [{"bytes": b, "path": None}]


# ------------------------------------------------------------------------------------------------------ messages


def test_placeholders_become_image_parts():
    assert split_placeholders("<image>A<image><image>B") == [
        {"type": "image"},
        {"type": "text", "text": "A"},
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "B"},
    ]
    msgs, n = build_messages([{"role": "user", "content": "Hi <image> there"}], system_prompt="Be brief.")
    assert n == 1 and msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1]["content"] == [
        {"type": "text", "text": "Hi "},
        {"type": "image"},
        {"type": "text", "text": " there"},
    ]
    msgs, n = build_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "no image"}], "X")
    assert n == 0 and msgs == [{"role": "system", "content": "S"}, {"role": "user", "content": "no image"}]


# ------------------------------------------------------------------------------------------------------ reading


def test_verl_parquet_read_unchanged(tmp_path, tiny_processor):
    wide = png("blue", (200, 90))
    recs = [
        verl_record("<image>Find x.", "3", img(png("red", (80, 60)))),
        verl_record("Compare <image> with <image>.", "same", img(wide) + img(png("green")), index=1),
        verl_record("What is 2+2?", "4", [], index=2),
    ]
    path = write_verl(tmp_path / "verl" / "train.parquet", recs)
    ds = RLDataset(str(path), tiny_processor, cfg(path), split="train", verbose=False)
    assert len(ds) == 3 and ds.max_images_per_prompt == 2
    assert ds.report["rows_read"] == 3 and ds.report["filtered"] == 0

    ip = tiny_processor.image_processor
    factor, (lo, hi) = qwen_vl.patch_factor(ip), qwen_vl.pixel_bounds(ip)
    pad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).image_pad
    for i, rec in enumerate(recs):
        s = ds[i]
        n = len(rec["images"])
        expect_msgs, _ = build_messages(rec["prompt"])
        assert s.messages == expect_msgs
        assert s.prompt_text == tiny_processor.apply_chat_template(
            expect_msgs, add_generation_prompt=True, tokenize=False
        )
        assert s.prompt_ids.count(pad) == n  # ONE pad per image: the engine expands them
        assert s.prompt_ids == tiny_processor.tokenizer(s.prompt_text, add_special_tokens=False)["input_ids"]
        assert (s.index, s.uid, s.data_source) == (i, f"{path}:{i}", "hiyouga/geometry3k")
        assert s.ground_truth == rec["reward_model"]["ground_truth"] and s.extra_info == rec["extra_info"]
        originals = [Image.open(io.BytesIO(e["bytes"])).size for e in rec["images"]]
        assert s.original_sizes == originals
        for im, (w, h) in zip(s.images, originals):
            assert im.mode == "RGB" and im.size == qwen_vl.resized_size(w, h, factor, lo, hi)
            assert qwen_vl.resize_image(im, factor, lo, hi).size == im.size  # resized once: a fixed point
        # the length the filter used is the processor's expanded length (image tokens counted)
        kw = {"images": s.images} if n else {}
        expanded = tiny_processor(text=[s.prompt_text], return_tensors="pt", **kw)["input_ids"]
        assert int(ds.prompt_lengths[i]) == expanded.shape[1]
    assert ds[1].image_scales[0] == pytest.approx((ds[1].images[0].width / 200, ds[1].images[0].height / 90))


def test_preprocess_output_round_trip(tmp_path, tiny_processor):
    synthetic.main(
        [
            "--output-dir",
            str(tmp_path),
            "--families",
            "colour,grounding",
            "--train-size",
            "12",
            "--test-size",
            "0",
            "--no-progress",
        ]
    )
    path = tmp_path / "train.parquet"
    ds = RLDataset([str(path)], tiny_processor, cfg(path), verbose=False)
    recs = pq.read_table(path).to_pylist()
    assert len(ds) == len(recs)
    for s, rec in zip(ds.get_batch(range(len(ds))), recs):
        assert s.data_source == rec["data_source"] and s.ground_truth == rec["reward_model"]["ground_truth"]
        assert s.extra_info == rec["extra_info"] and s.original_sizes == [(56, 56)]
        assert s.messages[0]["content"][0] == {"type": "image"}


def test_multi_image_jsonl_to_dataset(tmp_path, tiny_processor):
    (tmp_path / "a.png").write_bytes(png("red", (60, 60)))
    (tmp_path / "b.png").write_bytes(png("blue", (90, 40)))
    src = tmp_path / "r.jsonl"
    src.write_text(
        json.dumps({"question": "<image> vs <image>: which is red?", "answer": "first", "images": ["a.png", "b.png"]})
        + "\n"
    )
    jsonl.main(["--input", str(src), "--output-dir", str(tmp_path / "out"), "--no-progress"])
    path = tmp_path / "out" / "train.parquet"
    ds = RLDataset(str(path), tiny_processor, cfg(path), verbose=False)
    s = ds[0]
    pad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).image_pad
    assert s.prompt_ids.count(pad) == 2 and len(s.images) == 2 and ds.max_images_per_prompt == 2
    assert s.original_sizes == [(60, 60), (90, 40)]
    assert [p["type"] for p in s.messages[0]["content"]] == ["image", "text", "image", "text"]
    assert s.images[0].getpixel((5, 5)) == (255, 0, 0) and s.images[1].getpixel((5, 5)) == (0, 0, 255)


def test_relative_image_paths_resolve_against_the_parquet_folder(tmp_path, tiny_processor, monkeypatch):
    (tmp_path / "data" / "imgs").mkdir(parents=True)
    (tmp_path / "data" / "imgs" / "x.png").write_bytes(png("green", (70, 50)))
    path = write_verl(
        tmp_path / "data" / "t.parquet", [verl_record("<image>Q", "a", [{"bytes": None, "path": "imgs/x.png"}])]
    )
    monkeypatch.chdir(tmp_path)  # not the parquet's folder
    ds = RLDataset(str(path), tiny_processor, cfg(path), verbose=False)
    assert ds[0].original_sizes == [(70, 50)] and ds[0].images[0].getpixel((1, 1)) == (0, 128, 0)


# ------------------------------------------------------------------------------------------------------ overlong


def test_overlong_with_images_filtered_and_reported_never_truncated(tmp_path, tiny_processor):
    big = png("red", (112, 112))  # 16 image tokens with the tiny processor's max_pixels
    recs = [
        verl_record("<image>One.", "a", img(big)),
        verl_record("<image><image>Two.", "b", img(big) * 2, 1),
        verl_record("Text only.", "c", [], 2),
    ]
    path = write_verl(tmp_path / "t.parquet", recs)
    full = RLDataset(str(path), tiny_processor, cfg(path, max_prompt_length=4096), verbose=False)
    one, two, text = (int(x) for x in full.prompt_lengths)
    assert two - one >= 16  # the second image's 16 tokens are counted, not one pad

    limit = one + 2  # the one-image prompt fits, the two-image prompt does not
    ds = RLDataset(str(path), tiny_processor, cfg(path, max_prompt_length=limit), verbose=False)
    assert len(ds) == 2 and ds.report["filtered"] == 1
    assert ds.report["filtered_by_reason"] == {"overlong_with_images": 1}
    assert [ds.source_of(i)[1] for i in range(len(ds))] == [0, 2]
    pad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).image_pad
    s = ds[0]
    assert s.prompt_ids.count(pad) == 1 and len(s.prompt_ids) - 1 + 16 == one <= limit  # nothing cut

    with pytest.raises(DataError, match=rf"{path} row 1: .*never truncated"):
        RLDataset(
            str(path),
            tiny_processor,
            cfg(path, max_prompt_length=limit, filter_overlong_prompts=False, truncation="left"),
            verbose=False,
        )


def test_text_only_truncation_modes(tmp_path, tiny_processor):
    long_q = " ".join(f"word{i}" for i in range(200))
    path = write_verl(
        tmp_path / "t.parquet", [verl_record("<image>Short.", "a", img(png())), verl_record(long_q, "b", [], 1)]
    )
    full = RLDataset(str(path), tiny_processor, cfg(path, max_prompt_length=100_000), verbose=False)
    full_ids = full[1].prompt_ids
    limit = int(full.prompt_lengths[0]) + 5  # the image prompt fits, the long text does not
    assert len(full_ids) > limit + 50

    filt = RLDataset(str(path), tiny_processor, cfg(path, max_prompt_length=limit), verbose=False)
    assert len(filt) == 1 and filt.report["filtered_by_reason"] == {"overlong_text": 1}
    with pytest.raises(DataError, match=rf"{path} row 1: text-only prompt"):
        RLDataset(
            str(path), tiny_processor, cfg(path, max_prompt_length=limit, filter_overlong_prompts=False), verbose=False
        )
    for mode, expect in (("left", full_ids[-limit:]), ("right", full_ids[:limit])):
        c = cfg(path, max_prompt_length=limit, filter_overlong_prompts=False, truncation=mode)
        ds = RLDataset(str(path), tiny_processor, c, verbose=False)
        assert len(ds) == 2 and ds.report["truncated_text_prompts"] == 1
        assert ds[1].prompt_ids == expect
        assert ds[1].prompt_text == tiny_processor.tokenizer.decode(expect, skip_special_tokens=False)
    with pytest.raises(ValueError, match="data.truncation"):
        RLDataset(str(path), tiny_processor, cfg(path, truncation="middle"), verbose=False)


# ------------------------------------------------------------------------------------------------------ errors


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_bad_records_name_file_and_row(tmp_path, tiny_processor, monkeypatch):
    ok = verl_record("<image>Q", "a", img(png()))
    path = write_verl(tmp_path / "m.parquet", [ok, verl_record("<image><image>Q", "a", img(png()), 1)])
    with pytest.raises(DataError, match=rf"{path} row 1: 2 <image> placeholder\(s\) .* but 1 image"):
        RLDataset(str(path), tiny_processor, cfg(path), verbose=False)

    path = write_verl(tmp_path / "inj.parquet", [ok, verl_record("<|image_pad|> <image>Q", "a", img(png()), 1)])
    with pytest.raises(DataError, match=rf"{path} row 1: .*2 image pad token"):
        RLDataset(str(path), tiny_processor, cfg(path), verbose=False)

    big = write_verl(tmp_path / "bomb.parquet", [ok, verl_record("<image>Q", "a", img(png("red", (100, 100))), 1)])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 100x100 > 2 * 2000: refused at the header
    with pytest.raises(DataError, match=rf"{big} row 1: image 0: .*decompression-bomb"):
        RLDataset(str(big), tiny_processor, cfg(big), verbose=False)
    monkeypatch.undo()

    whole = png("red", (64, 64))
    noisy = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(noisy, format="PNG")
    cut = noisy.getvalue()[: len(noisy.getvalue()) // 2]  # header intact, pixel data truncated
    path = write_verl(
        tmp_path / "cut.parquet", [verl_record("<image>Q", "a", img(whole)), verl_record("<image>Q", "a", img(cut), 1)]
    )
    ds = RLDataset(str(path), tiny_processor, cfg(path), verbose=False)  # headers are fine
    ds[0]
    with pytest.raises(DataError, match=rf"{path} row 1: image 0: image cannot be decoded"):
        ds[1]


def test_custom_chat_template_is_sandboxed(tmp_path, tiny_processor):
    path = write_verl(tmp_path / "t.parquet", [verl_record("<image>Q?", "a", img(png()))])
    template = (
        "{% for m in messages %}[{{ m['role'] }}]{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    ds = RLDataset(
        str(path), tiny_processor, cfg(path, custom_chat_template=template, system_prompt="Be brief."), verbose=False
    )
    assert ds[0].prompt_text == (
        "[system]Be brief.[user]<|vision_start|><|image_pad|><|vision_end|>Q? " + INSTRUCTION + "[assistant]"
    )
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(DataError, match=r"row 0: chat template failed: SecurityError"):
        RLDataset(str(path), tiny_processor, cfg(path, custom_chat_template=evil), verbose=False)


def test_min_max_pixels_override(tmp_path, tiny_processor):
    path = write_verl(tmp_path / "t.parquet", [verl_record("<image>Q", "a", img(png("red", (224, 224))))])
    ds = RLDataset(str(path), tiny_processor, cfg(path, min_pixels=28 * 28, max_pixels=28 * 28 * 4), verbose=False)
    assert ds[0].images[0].size == (56, 56) and ds.pixel_bounds == (784, 3136)
    pad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).image_pad
    assert int(ds.prompt_lengths[0]) == len(ds[0].prompt_ids) - 1 + 4 and ds[0].prompt_ids.count(pad) == 1


def test_threaded_batches_and_pickling_give_the_same_records(tmp_path, tiny_processor):
    colours = ["red", "green", "blue", "yellow", "purple"]
    recs = [verl_record(f"<image>Q{i}", str(i), img(png(colours[i % 5], (60 + i, 50))), i) for i in range(40)]
    path = write_verl(tmp_path / "t.parquet", recs, row_group_size=7)
    ds = RLDataset(str(path), tiny_processor, cfg(path), verbose=False)

    def key(s):
        return (s.index, s.prompt_ids, s.original_sizes, [im.tobytes() for im in s.images])

    order = BatchSampler(40, 40, seed=3).batches(0)[0]
    serial = [key(s) for s in ds.get_batch(order)]
    assert [key(s) for s in ds.get_batch(order, num_workers=2)] == serial
    back = pickle.loads(pickle.dumps(ds))
    assert [key(s) for s in back.get_batch(order, num_workers=2)] == serial
    assert [ds.source_of(i)[1] for i in order] == [s[0] for s in serial]


# ------------------------------------------------------------------------------------------------------ sampler


def _run(sampler: BatchSampler, n_batches: int) -> list[list[int]]:
    out: list[list[int]] = []
    while len(out) < n_batches:
        for b in sampler:
            out.append(b)
            if len(out) == n_batches:
                break
    return out


def test_sampler_deterministic_epochs_and_resume():
    a, b = BatchSampler(10, 3, shuffle=True, seed=7), BatchSampler(10, 3, shuffle=True, seed=7)
    assert len(a) == 3
    assert _run(a, 9) == _run(b, 9)  # same seed, same order (three epochs)
    epochs = [BatchSampler(10, 3, seed=7).batches(e) for e in range(2)]
    assert epochs[0] != epochs[1]
    assert all(len({i for bt in ep for i in bt}) == 9 for ep in epochs)  # no repeats; drop_last drops one
    assert BatchSampler(10, 3, seed=8).batches(0) != epochs[0]
    assert BatchSampler(10, 3, shuffle=False).batches(0) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert BatchSampler(10, 3, shuffle=False, drop_last=False).batches(0)[-1] == [9]

    reference = _run(BatchSampler(10, 3, seed=7), 8)
    for stop in (1, 3, 4, 5):  # 3: saved right after an epoch's last batch
        s = BatchSampler(10, 3, seed=7)
        head = _run(s, stop)
        resumed = BatchSampler(10, 3, seed=7)
        resumed.load_state_dict(json.loads(json.dumps(s.state_dict())))  # survives a JSON checkpoint
        assert head + _run(resumed, 8 - stop) == reference

    with pytest.raises(ValueError, match="batch_size=3 but this run has batch_size=4"):
        BatchSampler(10, 4, seed=7).load_state_dict(BatchSampler(10, 3, seed=7).state_dict())
    with pytest.raises(ValueError, match="fewer than one batch"):
        BatchSampler(2, 3)


# ------------------------------------------------------------------------------------------------------ memory


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow  # 10,000 records decoded, ~11 s
@pytest.mark.serial  # a bound on elapsed time
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_10k_records_iterate_with_bounded_memory(tmp_path, tiny_processor):
    colours = [png(c, (112, 112)) for c in ("red", "green", "blue", "yellow", "purple", "orange", "cyan", "black")]
    n = 10_000
    recs = [verl_record(f"<image>Q{i}: colour?", str(i % 8), img(colours[i % 8]), i) for i in range(n)]
    for r in recs:  # short prompts (no instruction): the test is about images
        r["prompt"][0]["content"] = r["extra_info"]["question"]
    path = write_verl(tmp_path / "big.parquet", recs)
    del recs
    ds = RLDataset(str(path), tiny_processor, cfg(path), verbose=False)
    assert len(ds) == n and ds.report["seconds"] < 30
    sampler = BatchSampler(n, 50, shuffle=True, seed=0)
    it = iter(sampler)
    for _ in range(10):  # warm up allocator pools and caches
        ds.get_batch(next(it))
    before = _rss_mb()
    seen = 500
    for indices in it:
        batch = ds.get_batch(indices)
        seen += len(batch)
        assert batch[0].images[0].size == (112, 112)
    growth = _rss_mb() - before
    assert seen == n
    # holding the decoded images would cost 10k x 112 x 112 x 4 bytes = 500 MB
    assert growth < 60, f"RSS grew {growth:.0f} MB over 10k records"
    assert all(len(src._cache) <= src.cache_row_groups for src in ds.sources)
