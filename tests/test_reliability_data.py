"""Bad input through preprocessing (``preprocess/jsonl.py``) and through training-time loading (``RLDataset``):
corrupt, truncated, empty and bomb images, unusual image modes, missing paths and columns, wrong ``<image>`` counts,
text that is not UTF-8, empty or missing answers, overlong prompts, wrong column types.

Every bad row is either an error naming its file and row, or a counted, reported reject/skip: no record disappears
without a trace. Unusual but valid images (CMYK, palette, 16-bit, alpha, 1x1) are accepted and load as 8-bit RGB."""

from __future__ import annotations

import io
import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlmrl.config import DataConfig
from vlmrl.data import DataError, RLDataset
from vlmrl.models import qwen_vl
from vlmrl.preprocess import common, jsonl

# ------------------------------------------------------------------------------------------------------- images


def encode(im: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def png(colour: str | tuple = "red", size: tuple[int, int] = (40, 30)) -> bytes:
    return encode(Image.new("RGB", size, colour))


def noise(fmt: str) -> bytes:
    """A 64x64 noise image: it does not compress, so half the file is half the pixel data."""
    return encode(Image.effect_noise((64, 64), 60).convert("RGB"), fmt)


def truncated(fmt: str) -> bytes:
    data = noise(fmt)
    return data[: len(data) // 2]  # header intact, pixel data cut


def bomb_png(width: int = 20_000, height: int = 20_000) -> bytes:
    """A valid 1x1 PNG whose IHDR claims ``width`` x ``height`` (CRC recomputed): 400 M pixels, nothing allocated."""
    data = bytearray(png("black", (1, 1)))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def unusual_images() -> dict[str, bytes]:
    """Valid images in modes other than 8-bit RGB (name → encoded bytes)."""
    palette = Image.new("P", (40, 30), 0)
    palette.putpalette([255, 0, 0, 0, 200, 0] + [0] * 762)
    palette.paste(1, (20, 0, 40, 30))  # left half index 0 (transparent), right half index 1 (green)
    rgba = Image.new("RGBA", (40, 30), (255, 0, 0, 0))  # left half fully transparent red
    rgba.paste((0, 0, 255, 255), (20, 0, 40, 30))  # right half opaque blue
    return {
        "cmyk.jpg": encode(Image.new("CMYK", (40, 30), (0, 255, 255, 0)), "JPEG", quality=95),  # red
        "palette.png": encode(palette, "PNG", transparency=0),
        "grey16.png": encode(Image.fromarray(np.full((30, 40), 32768, np.uint16))),  # mid grey at 16 bits
        "rgba.png": encode(rgba),
        "la.png": encode(Image.new("LA", (40, 30), (0, 0))),  # black, fully transparent
        "one.png": png((0, 255, 0), (1, 1)),
    }


# pixel at (x fraction, y fraction) of the loaded (resized, RGB) image → expected colour, tolerance
UNUSUAL_PIXELS = {
    "cmyk.jpg": [((0.5, 0.5), (255, 0, 0), 8)],
    "palette.png": [((0.1, 0.5), (255, 255, 255), 0), ((0.9, 0.5), (0, 200, 0), 0)],
    "grey16.png": [((0.5, 0.5), (128, 128, 128), 1)],  # scaled to 8 bits, not clipped to white
    "rgba.png": [((0.1, 0.5), (255, 255, 255), 0), ((0.9, 0.5), (0, 0, 255), 0)],
    "la.png": [((0.5, 0.5), (255, 255, 255), 0)],
    "one.png": [((0.5, 0.5), (0, 255, 0), 0)],
}


def close(got: tuple, want: tuple, tol: int) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(got, want))


# ------------------------------------------------------------------------------------------ preprocessing: jsonl


_ABSENT = object()


def line(question, answer="x", images=("a.png",)) -> bytes:
    """One JSON line; ``_ABSENT`` leaves a field out."""
    rec = {"question": question, "answer": answer, "images": list(images) if isinstance(images, tuple) else images}
    return json.dumps({k: v for k, v in rec.items() if v is not _ABSENT}).encode()


GOOD = line("<image>What colour?", "red")

# name → (raw JSON line, reject reason, regex the reject detail must match)
JSONL_CASES: dict[str, tuple[bytes, str, str]] = {
    "corrupt_bytes": (
        line("<image>Q", images=["garbage.png"]),
        "corrupt_image",
        r"garbage\.png: not an image Pillow can identify \(200 bytes starting b'this is '\)",
    ),
    "truncated_png": (line("<image>Q", images=["cut.png"]), "corrupt_image", r"cut\.png: .*(truncated|broken)"),
    "truncated_jpeg": (line("<image>Q", images=["cut.jpg"]), "corrupt_image", r"cut\.jpg: OSError: image file is"),
    "zero_byte_image": (line("<image>Q", images=["empty.png"]), "corrupt_image", r"empty\.png: empty image \(0"),
    "bomb_20000x20000": (
        line("<image>Q", images=["bomb.png"]),
        "image_too_large",
        r"bomb\.png: Image size \(400000000 pixels\) exceeds limit",
    ),
    "image_not_found": (line("<image>Q", images=["nope.png"]), "unreadable_image", r"nope\.png: FileNotFoundError"),
    "missing_image_field": (
        line("<image>Q", images=_ABSENT),
        "missing_field",
        r"^images is missing but the question has 1 <image> placeholder",
    ),
    "null_image_field": (line("<image><image>Q", images=None), "missing_field", r"images is missing .* 2 <image>"),
    "too_many_placeholders": (line("<image><image>Q"), "image_count_mismatch", r"2 <image> placeholder\(s\) for 1 im"),
    "no_placeholder": (line("Q without placeholder"), "image_count_mismatch", r"0 <image> placeholder\(s\) for 1 im"),
    "latin1_line": (
        b'{"question": "<image>caf\xe9?", "answer": "x", "images": ["a.png"]}',
        "invalid_record",
        r"line is not UTF-8 text \(byte 0xe9 at byte 25\)",
    ),
    "lone_surrogate_question": (
        b'{"question": "<image>bad \\udcff", "answer": "x", "images": ["a.png"]}',
        "invalid_record",
        r"question is not valid UTF-8 text \(\\udcff at character 11\)",
    ),
    "lone_surrogate_answer": (
        b'{"question": "<image>Q", "answer": "\\ud800", "images": ["a.png"]}',
        "invalid_record",
        r"answer is not valid UTF-8",
    ),
    "lone_surrogate_path": (
        b'{"question": "<image>Q", "answer": "x", "images": ["\\udcff.png"]}',
        "invalid_record",
        r"images\[0\]\.path is not valid UTF-8",
    ),
    "empty_answer": (line("<image>Q", answer="   "), "empty_answer", r"answer is empty"),
    "null_answer": (line("<image>Q", answer=None), "missing_field", r"answer is missing"),
    "missing_answer": (line("<image>Q", answer=_ABSENT), "missing_field", r"answer is missing"),
    "question_is_number": (line(42), "invalid_record", r"question is int, expected a string"),
    "images_is_object": (line("<image>Q", images={"a": 1}), "invalid_record", r"images must be a list of paths"),
    "images_hold_numbers": (line("<image>Q", images=[7]), "invalid_record", r"images must be a list of paths"),
    "answer_is_bool": (line("<image>Q", answer=True), "invalid_record", r"answer is bool"),
    "line_is_array": (b'["<image>Q", "x"]', "invalid_record", r"line is a JSON list, expected an object"),
    "not_json": (b'{"question": "<image>Q", "answer": ', "invalid_record", r"not JSON"),
}


def image_folder(root: Path) -> Path:
    """The images the jsonl cases refer to."""
    d = root / "imgs"
    d.mkdir(parents=True, exist_ok=True)
    (d / "a.png").write_bytes(png("red"))
    (d / "garbage.png").write_bytes(b"this is not an image" * 10)
    (d / "cut.png").write_bytes(truncated("PNG"))
    (d / "cut.jpg").write_bytes(truncated("JPEG"))
    (d / "empty.png").write_bytes(b"")
    (d / "bomb.png").write_bytes(bomb_png())
    (d / "\udcff.png").write_bytes(png())  # the file name is byte 0xff: it exists, but is not UTF-8 text
    for name, data in unusual_images().items():
        (d / name).write_bytes(data)
    return d


def run_jsonl(src: Path, img: Path, out: Path, *extra: str) -> dict:
    return jsonl.main(["--input", str(src), "--image-dir", str(img), "--output-dir", str(out), "--no-progress", *extra])


def read_rejects(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("case", list(JSONL_CASES))
def test_jsonl_bad_row_rejected_with_reason_or_strict_error(tmp_path, case):
    raw, reason, detail = JSONL_CASES[case]
    img = image_folder(tmp_path)
    src = tmp_path / "r.jsonl"
    src.write_bytes(GOOD + b"\n" + raw + b"\n" + GOOD + b"\n")

    out = tmp_path / "out"
    report = run_jsonl(src, img, out)
    split = report["splits"]["train"]
    assert (split["rows_read"], split["written"], split["rejected"]) == (3, 2, 1)
    assert split["rejected_by_reason"] == {reason: 1}
    (rej,) = read_rejects(out)
    assert rej["source"] == f"{src}:2" and rej["reason"] == reason and rej["split"] == "train"
    assert re.search(detail, rej["detail"]), rej["detail"]
    assert "BytesIO" not in rej["detail"]  # no in-memory object (or its address) in place of the file
    assert json.loads((out / "report.json").read_text())["splits"]["train"]["rejected"] == 1
    assert [r["extra_info"]["index"] for r in pq.read_table(out / "train.parquet").to_pylist()] == [0, 2]

    strict = tmp_path / "strict"
    with pytest.raises(common.PreprocessError, match=rf"^--strict: {re.escape(str(src))}:2: rejected \({reason}\)"):
        run_jsonl(src, img, strict, "--strict")
    assert not (strict / "train.parquet").exists() and not list(strict.glob("*.tmp"))


def test_jsonl_all_bad_rows_at_once_counts_add_up_on_any_num_proc(tmp_path):
    img = image_folder(tmp_path)
    src = tmp_path / "all.jsonl"
    lines = [GOOD]
    for raw, _, _ in JSONL_CASES.values():
        lines += [raw, GOOD]
    src.write_bytes(b"\n".join(lines) + b"\n")
    expect = [(f"{src}:{2 * k + 2}", reason) for k, (_, reason, _) in enumerate(JSONL_CASES.values())]

    results = []
    for num_proc in ("1", "2"):
        out = tmp_path / f"out{num_proc}"
        split = run_jsonl(src, img, out, "--num-proc", num_proc)["splits"]["train"]
        n_bad = len(JSONL_CASES)
        assert (split["rows_read"], split["written"], split["rejected"]) == (2 * n_bad + 1, n_bad + 1, n_bad)
        assert split["written"] + split["rejected"] == len(lines)  # nothing vanished
        rej = read_rejects(out)
        assert [(r["source"], r["reason"]) for r in rej] == expect
        assert len(pq.read_table(out / "train.parquet")) == n_bad + 1
        results.append(((out / "train.parquet").read_bytes(), rej))
    assert results[0] == results[1]


def test_jsonl_non_utf8_file_with_bom_and_blank_lines(tmp_path):
    """A UTF-8 byte-order mark is not an error; latin-1 lines are rejected one by one, naming their line."""
    img = image_folder(tmp_path)
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(
        b"\xef\xbb\xbf"
        + GOOD
        + b"\n"  # line 1, after a byte-order mark
        + b"\n"  # line 2: blank, not a record
        + '{"question": "<image>caf\u00e9?", "answer": "x", "images": ["a.png"]}\n'.encode("latin-1")  # line 3
        + b"\xff\xfe\n"  # line 4
        + '{"question": "<image>Q\u00e9", "answer": "\u00e9", "images": ["a.png"]}\n'.encode()  # line 5: real UTF-8
    )
    out = tmp_path / "out"
    split = run_jsonl(src, img, out)["splits"]["train"]
    assert (split["written"], split["rejected"]) == (2, 2)
    assert [(r["source"], r["reason"]) for r in read_rejects(out)] == [
        (f"{src}:3", "invalid_record"),
        (f"{src}:4", "invalid_record"),
    ]
    recs = pq.read_table(out / "train.parquet").to_pylist()
    assert recs[1]["reward_model"]["ground_truth"] == "\u00e9" and recs[0]["extra_info"]["index"] == 0


def test_jsonl_unusual_images_accepted_and_loaded_as_rgb(tmp_path, tiny_processor):
    img = image_folder(tmp_path)
    names = list(unusual_images())
    src = tmp_path / "modes.jsonl"
    src.write_bytes(b"\n".join(line("<image>What is shown?", "x", [n]) for n in names) + b"\n")
    out = tmp_path / "out"
    split = run_jsonl(src, img, out)["splits"]["train"]
    assert (split["written"], split["rejected"]) == (len(names), 0)
    recs = pq.read_table(out / "train.parquet").to_pylist()
    assert [r["images"][0]["bytes"] for r in recs] == [(img / n).read_bytes() for n in names]  # stored untouched

    path = out / "train.parquet"
    ds = RLDataset(str(path), tiny_processor, DataConfig(max_prompt_length=4096), verbose=False)
    assert len(ds) == len(names)
    ip = tiny_processor.image_processor
    factor, (lo, hi) = qwen_vl.patch_factor(ip), qwen_vl.pixel_bounds(ip)
    for i, name in enumerate(names):
        s = ds[i]
        (im,) = s.images
        w, h = Image.open(img / name).size
        assert s.original_sizes == [(w, h)]
        assert im.mode == "RGB", name
        assert im.size == qwen_vl.resized_size(w, h, factor, lo, hi), name
        assert im.width % factor == 0 and im.height % factor == 0 and lo <= im.width * im.height <= hi
        for (fx, fy), want, tol in UNUSUAL_PIXELS[name]:
            got = im.getpixel((int(fx * (im.width - 1)), int(fy * (im.height - 1))))
            assert close(got, want, tol), (name, got, want)
        # the image the trainer's processor gets is the same one: resizing again is the identity
        assert qwen_vl.resize_image(im, factor, lo, hi).tobytes() == im.tobytes()


def test_overlong_prompt_kept_by_preprocessing_then_filtered_and_reported_by_the_dataset(
    tmp_path, tiny_processor, capsys
):
    img = image_folder(tmp_path)
    long_q = "<image>" + " ".join(f"word{i}" for i in range(400))
    src = tmp_path / "long.jsonl"
    src.write_bytes(GOOD + b"\n" + line(long_q) + b"\n" + line("Text only: " + long_q[7:], images=()) + b"\n")
    out = tmp_path / "out"
    split = run_jsonl(src, img, out)["splits"]["train"]
    assert (split["written"], split["rejected"]) == (3, 0)  # preprocessing has no tokenizer: nothing is cut
    assert pq.read_table(out / "train.parquet").to_pylist()[1]["extra_info"]["question"] == long_q

    path = out / "train.parquet"
    ds = RLDataset(str(path), tiny_processor, DataConfig(max_prompt_length=200))
    printed = capsys.readouterr().out
    assert len(ds) == 1 and ds.source_of(0) == (str(path), 0)
    assert ds.report["rows_read"] == ds.report["kept"] + ds.report["filtered"] == 3
    assert ds.report["filtered_by_reason"] == {"overlong_text": 1, "overlong_with_images": 1}
    assert "3 rows from 1 file(s) -> 1 prompts; filtered 2 (overlong_text: 1, overlong_with_images: 1;" in printed
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))} row 1: prompt is \d+ tokens .* never truncated"):
        RLDataset(str(path), tiny_processor, DataConfig(max_prompt_length=200, filter_overlong_prompts=False))


# ------------------------------------------------------------------------------------------ training-time loading

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("images", pa.list_(IMAGE_STRUCT)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("index", pa.int64()), ("question", pa.string())])),
    ]
)


def record(question: str = "<image>What colour?", images: list | None = None, answer: str | None = "red", index=0):
    return {
        "data_source": "test",
        "prompt": [{"role": "user", "content": question}],
        "images": [{"bytes": png(), "path": None}] if images is None else images,
        "ability": "visual",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": index, "question": question},
    }


def write(path: Path, table: pa.Table) -> str:
    pq.write_table(table, path)
    return str(path)


def good_then(bad: dict, path: Path) -> str:
    """A parquet file: a good record at row 0, ``bad`` at row 1."""
    return write(path, pa.Table.from_pylist([record(), bad], schema=SCHEMA))


def load(path: str, processor, **cfg) -> RLDataset:
    return RLDataset(path, processor, DataConfig(max_prompt_length=4096, **cfg), verbose=False)


def bytes_image(data: bytes) -> list[dict]:
    return [{"bytes": data, "path": None}]


def path_image(p: str) -> list[dict]:
    return [{"bytes": None, "path": p}]


# name → (images of row 1, when the error comes: "init" from the header, "get" when ds[1] decodes, message regex)
BAD_IMAGES = {
    "corrupt_bytes": (
        bytes_image(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20),
        "init",
        r"image cannot be read \(OSError: Truncated File Read\)",
    ),
    "truncated_png": (bytes_image(truncated("PNG")), "get", r"image cannot be decoded \((OSError|SyntaxError): "),
    "truncated_jpeg": (
        bytes_image(truncated("JPEG")),
        "get",
        r"image cannot be decoded \(OSError: image file is truncated",
    ),
    "zero_bytes": (bytes_image(b""), "init", r"image is empty \(0 bytes\) and has no path"),
    "zero_byte_file": (path_image("imgs/empty.png"), "init", r"image file is empty \(0 bytes\): .*imgs/empty\.png"),
    "bomb_20000x20000": (
        bytes_image(bomb_png()),
        "init",
        r"image refused by Pillow's decompression-bomb guard: Image size \(400000000 pixels\)",
    ),
    "path_not_found": (path_image("imgs/nope.png"), "init", r"image file not found: .*imgs/nope\.png"),
    "neither_bytes_nor_path": ([{"bytes": None, "path": None}], "init", r"image entry has neither bytes nor path"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_dataset_bad_image_names_file_row_and_image(tmp_path, tiny_processor, case):
    images, when, message = BAD_IMAGES[case]
    image_folder(tmp_path)
    path = good_then(record(images=images, index=1), tmp_path / "d.parquet")
    pattern = rf"^{re.escape(path)} row 1: image 0: {message}"
    if when == "init":
        with pytest.raises(DataError, match=pattern):
            load(path, tiny_processor)
        return
    ds = load(path, tiny_processor)  # the header is fine: the pixels are decoded on access
    assert ds[0].images[0].size == qwen_vl.resized_size(40, 30, ds.patch_factor, *ds.pixel_bounds)
    with pytest.raises(DataError, match=pattern):
        ds[1]
    with pytest.raises(DataError, match=pattern):  # from a worker thread too
        ds.get_batch([0, 1], num_workers=2)


def test_dataset_unusual_images_from_bytes_and_paths(tmp_path, tiny_processor):
    """Valid unusual images load as 8-bit RGB whether stored as bytes or as (relative) paths."""
    img = image_folder(tmp_path)
    names = list(unusual_images())
    recs = [record(images=bytes_image((img / n).read_bytes()), index=k) for k, n in enumerate(names)]
    recs += [record(images=path_image(f"imgs/{n}"), index=len(names) + k) for k, n in enumerate(names)]
    path = write(tmp_path / "modes.parquet", pa.Table.from_pylist(recs, schema=SCHEMA))
    ds = load(path, tiny_processor)
    assert len(ds) == 2 * len(names)
    batch = ds.get_batch(range(len(ds)))
    for k, s in enumerate(batch):
        name = names[k % len(names)]
        (im,) = s.images
        assert im.mode == "RGB" and s.original_sizes == [Image.open(img / name).size], name
        assert im.tobytes() == batch[k % len(names)].images[0].tobytes()  # bytes and path give the same pixels


def test_dataset_wrong_placeholder_count_and_missing_image_column(tmp_path, tiny_processor):
    path = good_then(record("<image>Q", images=[], index=1), tmp_path / "few.parquet")
    with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: 1 <image> placeholder\(s\) .* but 0 image"):
        load(path, tiny_processor)
    path = good_then(record("No placeholder", index=1), tmp_path / "many.parquet")
    with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: 0 <image> placeholder\(s\) .* but 1 image"):
        load(path, tiny_processor)

    table = pa.Table.from_pylist([record("Text only?", images=[]), record(index=1)], schema=SCHEMA)
    path = write(tmp_path / "noimages.parquet", table.drop_columns(["images"]))
    with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: .*the file has no column 'images'"):
        load(path, tiny_processor)
    with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: .*the file has no column 'pics'"):
        load(path, tiny_processor, image_key="pics")
    text_only = write(tmp_path / "text.parquet", table.slice(0, 1).drop_columns(["images"]))
    assert len(load(text_only, tiny_processor)) == 1  # a text-only file needs no image column


def test_dataset_missing_or_empty_answer(tmp_path, tiny_processor):
    for answer, why in ((None, "missing"), ("", "empty"), ("  ", "empty")):
        path = good_then(record(answer=answer, index=1), tmp_path / f"a{why}{len(answer or '')}.parquet")
        with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: reward_model\.ground_truth .* is {why}"):
            load(path, tiny_processor)
    bad = record(index=1)
    bad["reward_model"] = None
    path = good_then(bad, tmp_path / "null.parquet")
    with pytest.raises(DataError, match=rf"^{re.escape(path)} row 1: reward_model is missing \(null\)"):
        load(path, tiny_processor)

    table = pa.Table.from_pylist([record()], schema=SCHEMA)
    path = write(tmp_path / "nocol.parquet", table.drop_columns(["reward_model"]))
    with pytest.raises(DataError, match=rf"^{re.escape(path)}: no column 'reward_model'"):
        load(path, tiny_processor)
    # a model-scored record needs no ground truth
    model = record(answer=None)
    model["reward_model"]["style"] = "model"
    path = write(tmp_path / "model.parquet", pa.Table.from_pylist([model], schema=SCHEMA))
    assert load(path, tiny_processor)[0].ground_truth is None


def invalid_utf8(values: list[bytes]) -> pa.Array:
    """A string array holding raw bytes, unchecked (how a foreign writer can leave non-UTF-8 text in parquet)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_dataset_text_that_is_not_utf8_names_row_and_column(tmp_path, tiny_processor):
    base = pa.Table.from_pylist([record(), record(index=1)], schema=SCHEMA)
    offsets = pa.array([0, 1, 2], pa.int32())

    def replaced(name: str, column: pa.Array) -> pa.Table:
        return base.set_column(base.schema.get_field_index(name), name, column)

    prompt = pa.ListArray.from_arrays(
        offsets,
        pa.StructArray.from_arrays(
            [pa.array(["user", "user"]), invalid_utf8([b"<image>Q", b"<image>caf\xe9 ok"])], names=["role", "content"]
        ),
    )
    info = pa.StructArray.from_arrays([pa.array([0, 1]), invalid_utf8([b"ok", b"\xff"])], names=["index", "question"])
    images = pa.ListArray.from_arrays(
        offsets,
        pa.StructArray.from_arrays(
            [pa.array([png(), None]), invalid_utf8([b"", b"x\xfe.png"])], fields=list(IMAGE_STRUCT)
        ),
    )
    for name, column, detail in (
        ("prompt", prompt, r"invalid continuation byte: byte 0xe9 at byte 11"),
        ("extra_info", info, r"invalid start byte: byte 0xff at byte 1"),
        ("data_source", invalid_utf8([b"ok", b"s\x80"]), r"invalid start byte: byte 0x80 at byte 2"),
        ("images", images, r"invalid start byte: byte 0xfe at byte 2"),
    ):
        path = write(tmp_path / f"{name}.parquet", replaced(name, column))
        with pytest.raises(
            DataError, match=rf"^{re.escape(path)} row 1: column '{name}' holds text that is not valid UTF-8 \({detail}"
        ):
            load(path, tiny_processor)


def test_dataset_wrong_column_types_name_file_and_row(tmp_path, tiny_processor):
    base = pa.Table.from_pylist([record(), record(index=1)], schema=SCHEMA)

    def replaced(name: str, column: pa.Array, k: int) -> str:
        table = base.set_column(base.schema.get_field_index(name), name, column)
        return write(tmp_path / f"{name}{k}.parquet", table)

    content_int = pa.array([[{"role": "user", "content": 1}]] * 2)
    cases = [
        ("prompt", pa.array([7, 8]), r" row 0: bad 'prompt' column value: prompt is int, expected a non-empty list"),
        ("prompt", content_int, r" row 0: bad 'prompt' column value: message content is int"),
        ("prompt", pa.array([[], []], pa.list_(pa.struct([("role", pa.string())]))), r" row 0: bad 'prompt'"),
        ("images", pa.array([1, 2]), r": data.image_key='images' names a column of type int64, not images"),
        ("images", pa.array([[3], [4]]), r": data.image_key='images' names a column of type list<element: int64>"),
        ("reward_model", pa.array(["red", "red"]), r" row 0: reward_model is str, expected \{style, ground_truth\}"),
        ("extra_info", pa.array(["{}", "{}"]), r": column 'extra_info' is string, expected a struct"),
    ]
    for k, (name, column, message) in enumerate(cases):
        path = replaced(name, column, k)
        with pytest.raises(DataError, match="^" + re.escape(path) + message):
            load(path, tiny_processor)
