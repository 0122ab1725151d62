"""Generic JSON-lines records + an image folder → parquet in verl's record schema.

Each line is an object with a question (holding one ``<image>`` per image and one ``<video>`` per video), an answer,
``images`` (a list of paths relative to ``--image-dir``, or one path), ``videos`` (the same, each a video file or a
folder of frames; see ``preprocess/video.py`` for the sampling flags) and optionally ``boxes`` (``[x1, y1, x2, y2]``
or a list of them, in original image pixels; kept in ``extra_info.boxes``). Field names are configurable.
Multi-image prompts, and prompts mixing images and videos, are fine.

Tool tasks: a line's ``tools_kwargs`` and ``interaction_kwargs`` objects (verl's names, e.g. ``{"calc_geo3k_reward":
{"create_kwargs": {"ground_truth": "12"}}}``) go into ``extra_info`` as they are, where multi-turn rollouts read them
(``create_kwargs`` reach the tool's ``create``), as verl's multi-turn preprocessing writes them. Their parquet type is
inferred over the whole file (keys missing in a line are null); values of conflicting types are refused.

    python preprocess/jsonl.py --input records.jsonl --image-dir images/ --output-dir data/mine --split train
    python preprocess/jsonl.py --input clips.jsonl --image-dir media/ --output-dir data/clips --video-fps 2

A non-string answer (a number, a box) is stored as its JSON text.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from vlmrl.preprocess.common import (
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    ImageRules,
    PreprocessError,
    RecordError,
    build_record,
    check_image,
    check_placeholders,
    check_utf8,
    count_placeholders,
    image_struct,
    isfinite_number,
    record_features,
    require_text,
)
from vlmrl.preprocess.pipeline import (
    Item,
    add_common_args,
    cli_main,
    image_rules,
    run_split,
    write_report,
)
from vlmrl.preprocess.video import VideoOptions, add_video_args, video_options, video_struct

KWARGS_FIELDS = ("tools_kwargs", "interaction_kwargs")
"""verl's per-record tool and interaction arguments, kept in ``extra_info`` under the same names."""


def extra_info_features(kwargs_types: dict[str, Any] | None = None) -> dict[str, Any]:
    """``datasets`` features of the extra_info fields beyond split/index/answer/question; ``kwargs_types``: the
    arrow struct type of each ``KWARGS_FIELDS`` field the input holds (``infer_kwargs_types``)."""
    import datasets

    out: dict[str, Any] = {"boxes": datasets.List(datasets.List(datasets.Value("float64")))}
    for name, arrow_type in (kwargs_types or {}).items():
        out[name] = datasets.Features.from_arrow_schema(pa.schema([pa.field(name, arrow_type)]))[name]
    return out


def infer_kwargs_types(values: dict[str, list[Any]], where: str) -> dict[str, Any]:
    """The arrow type of each kwargs field over every line's value (objects only; all-empty fields are left out:
    parquet has no empty struct). ``PreprocessError`` when lines give a key values of conflicting types."""
    out = {}
    for name, vals in values.items():
        objs = [v for v in vals if isinstance(v, dict) and v]
        if not objs:
            continue
        try:
            out[name] = pa.array(objs).type
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise PreprocessError(
                f"{where}: the lines' {name} values do not share one type ({e}); give each key the "
                "same kind of value in every line"
            ) from None
    return out


@dataclass(frozen=True)
class JsonlOptions:
    """What decides one record (picklable: shipped to worker processes)."""

    split: str
    image_dir: str
    output_dir: str
    data_source: str
    ability: str
    instruction: str | None
    question_field: str
    answer_field: str
    images_field: str
    boxes_field: str
    kwargs_fields: tuple[str, ...]
    prepend_images: bool
    store_paths: bool
    rules: ImageRules
    videos_field: str = "videos"
    video: VideoOptions | None = None
    """How videos are read and sampled; None: the output has no videos column (no line names videos)."""


def _answer_text(value: Any, field: str) -> str:
    if value is None:
        raise RecordError("missing_field", f"{field} is missing")
    if isinstance(value, str):
        text = value
    elif isinstance(value, (int, float, list, dict)) and not isinstance(value, bool):
        text = json.dumps(value)
    else:
        raise RecordError("invalid_record", f"{field} is {type(value).__name__}")
    if not text.strip() or text in ("[]", "{}"):
        raise RecordError("empty_answer", f"{field} is empty")
    check_utf8(text, field)
    return text


def _boxes(value: Any, field: str) -> list[list[float]]:
    if value is None:
        return []
    if isinstance(value, list) and len(value) == 4 and all(isfinite_number(x) for x in value):
        value = [value]
    if not isinstance(value, list) or not all(
        isinstance(b, list) and len(b) == 4 and all(isfinite_number(x) for x in b) for b in value
    ):
        raise RecordError("invalid_record", f"{field} must be [x1, y1, x2, y2] or a list of them, got {value!r:.80}")
    return [[float(x) for x in b] for b in value]


def decode_line(raw: bytes | str) -> str:
    """A source line as text: UTF-8 (a leading byte-order mark dropped), else ``RecordError`` (invalid_record) naming
    the first bad byte and its column."""
    if isinstance(raw, str):
        return raw.removeprefix("\ufeff")
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.start + 1].hex()
        raise RecordError("invalid_record", f"line is not UTF-8 text (byte 0x{bad} at byte {e.start + 1})") from None


def build_line(payload: tuple[int, bytes | str], opts: JsonlOptions) -> dict[str, Any]:
    """One JSON line (raw bytes or text) → one verl record (raises ``RecordError`` for a bad line)."""
    index, raw = payload
    line = decode_line(raw)
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordError("invalid_record", f"not JSON: {e}") from None
    if not isinstance(rec, dict):
        raise RecordError("invalid_record", f"line is a JSON {type(rec).__name__}, expected an object")
    question = require_text(rec.get(opts.question_field), opts.question_field, "empty_question")
    answer = _answer_text(rec.get(opts.answer_field), opts.answer_field)
    paths = rec.get(opts.images_field)
    if paths is None:
        wanted = count_placeholders(question)
        if wanted:
            raise RecordError(
                "missing_field",
                f"{opts.images_field} is missing but the question has {wanted} {IMAGE_PLACEHOLDER} placeholder(s)",
            )
        paths = []
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise RecordError("invalid_record", f"{opts.images_field} must be a list of paths")
    videos = _paths(rec.get(opts.videos_field), opts.videos_field)
    if videos and opts.video is None:
        raise RecordError("invalid_record", f"{opts.videos_field} holds videos but no video options were given")
    if opts.prepend_images and videos and VIDEO_PLACEHOLDER not in question:
        question = VIDEO_PLACEHOLDER * len(videos) + question
    if opts.prepend_images and paths and count_placeholders(question) == 0:
        question = IMAGE_PLACEHOLDER * len(paths) + question
    check_placeholders(question, len(paths), len(videos))
    boxes = _boxes(rec.get(opts.boxes_field), opts.boxes_field)
    structs = []
    for k, rel in enumerate(paths):
        if not rel.strip():
            raise RecordError("unreadable_image", f"{opts.images_field}[{k}] is an empty path")
        full = Path(opts.image_dir) / rel
        checked = check_image(path=rel, rules=opts.rules)
        structs.append(
            image_struct(
                checked,
                source_path=full,
                source_name=rel,
                store_paths=opts.store_paths,
                output_dir=opts.output_dir,
                spill_name=f"{opts.split}/{index:07d}_{k}",
            )
        )
    extra: dict[str, Any] = {"boxes": boxes}
    for name in opts.kwargs_fields:
        value = rec.get(name)
        if value is not None and not isinstance(value, dict):
            raise RecordError("invalid_record", f"{name} must be an object, got {type(value).__name__}")
        extra[name] = value or None
    clips = [
        video_struct(
            rel,
            opts.video,
            store_paths=opts.store_paths,
            output_dir=opts.output_dir,
            spill_name=f"{opts.split}/{index:07d}_video{k}",
        )
        for k, rel in enumerate(videos)
        if opts.video is not None
    ]
    return build_record(
        data_source=opts.data_source,
        question=question,
        answer=answer,
        images=structs,
        split=opts.split,
        index=index,
        ability=opts.ability,
        instruction=opts.instruction,
        extra_info=extra,
        videos=clips if opts.video is not None else None,
    )


def _paths(value: Any, field: str) -> list[str]:
    """A videos field: a path or a list of paths ([] when absent)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise RecordError("invalid_record", f"{field} must be a list of paths")
    return value


def _blank(raw: bytes) -> bool:
    return not raw.decode("utf-8", "replace").strip()


def read_lines(path: Path) -> Iterator[Item]:
    """Non-blank lines as work items; the record index counts non-blank lines, the source names the line number.

    Lines are read as bytes and decoded one by one (``build_line``), so a line that is not UTF-8 is rejected with its
    line number instead of stopping the run."""
    index = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if _blank(raw):
                continue
            yield Item(f"{path}:{lineno}", (index, raw))
            index += 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="records, one JSON object per line")
    p.add_argument("--image-dir", default=None, help="folder the image paths are relative to (default: the input's)")
    add_common_args(p)
    p.add_argument("--split", default="train", help="output split name: OUT/<split>.parquet")
    p.add_argument("--data-source", default=None, help="data_source of every record (default: jsonl/<input stem>)")
    p.add_argument("--ability", default="visual", help="ability field of every record")
    p.add_argument("--instruction", default=None, help="text appended to every question after a space")
    p.add_argument("--question-field", default="question")
    p.add_argument("--answer-field", default="answer")
    p.add_argument("--images-field", default="images")
    p.add_argument("--boxes-field", default="boxes")
    p.add_argument("--videos-field", default="videos", help="field of the video files or frame folders")
    p.add_argument(
        "--prepend-images",
        action="store_true",
        help=f"a question without {IMAGE_PLACEHOLDER} ({VIDEO_PLACEHOLDER}) gets one per image (video) in front "
        "(else it is rejected)",
    )
    add_video_args(p)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point: read the lines, build and validate records, write parquet and the report."""
    a = parse_args(argv)
    started = time.perf_counter()
    src = Path(a.input)
    if not src.is_file():
        raise PreprocessError(f"{src}: no such file")
    image_dir = Path(a.image_dir) if a.image_dir else src.parent
    if not image_dir.is_dir():
        raise PreprocessError(f"--image-dir {image_dir}: no such folder")
    total, has_videos, kwargs_values = 0, False, {name: [] for name in KWARGS_FIELDS}
    needle = f'"{a.videos_field}"'.encode()
    with open(src, "rb") as f:
        for raw in f:
            if _blank(raw):
                continue
            total += 1
            has_videos = has_videos or needle in raw  # a videos column only for data that names videos
            if b"_kwargs" in raw:  # a line that cannot be read is rejected later, with its line number
                try:
                    rec = json.loads(decode_line(raw))
                except (RecordError, json.JSONDecodeError):
                    continue
                for name in KWARGS_FIELDS:
                    kwargs_values[name].append(rec.get(name) if isinstance(rec, dict) else None)
    kwargs_types = infer_kwargs_types(kwargs_values, str(src))
    opts = JsonlOptions(
        split=a.split,
        image_dir=str(image_dir),
        output_dir=str(a.output_dir),
        data_source=a.data_source or f"jsonl/{src.stem}",
        ability=a.ability,
        instruction=a.instruction,
        question_field=a.question_field,
        answer_field=a.answer_field,
        images_field=a.images_field,
        boxes_field=a.boxes_field,
        kwargs_fields=tuple(kwargs_types),
        prepend_images=a.prepend_images,
        store_paths=a.store_paths,
        rules=image_rules(a, image_dir),
    )
    try:
        video = video_options(a, image_dir) if has_videos else None
    except ValueError as e:
        raise PreprocessError(str(e)) from None
    opts = dataclasses.replace(opts, video=video)
    result = run_split(
        a.split,
        read_lines(src),
        functools.partial(build_line, opts=opts),
        Path(a.output_dir) / f"{a.split}.parquet",
        record_features(extra_info_features(kwargs_types), videos=video is not None),
        total=total,
        num_proc=a.num_proc,
        strict=a.strict,
        progress=not a.no_progress,
        row_group_size=a.row_group_size,
    )
    config = {"input": str(src), "image_dir": str(image_dir), "split": a.split, "data_source": opts.data_source}
    if video is not None:
        config["video"] = dataclasses.asdict(video)
    return write_report(a.output_dir, [result], name="jsonl", config=config, started=started)


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    raise SystemExit(cli_main(main))
