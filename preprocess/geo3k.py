"""Geometry3K → parquet in verl's record schema (interchangeable with verl's ``examples/data_preprocess/geo3k.py``).

Input (``--input``): a hub id (default ``hiyouga/geometry3k``, loaded with ``datasets.load_dataset``), a folder saved
with ``datasets.save_to_disk``, a folder of parquet files named by split (``data/train-00000-of-00001.parquet`` as in
a hub snapshot), or one parquet file named after its split. Source columns: ``images`` (list of ``{bytes, path}``),
``problem`` (with ``<image>``), ``answer``. Output: ``DIR/train.parquet`` and ``DIR/test.parquet`` (``--splits``).

Unlike a ``datasets.map`` over decoded images, the image bytes are copied as they are (decoded once to validate,
never re-encoded).

    python preprocess/geo3k.py --input /data/geometry3k_saved --output-dir data/geo3k
"""

from __future__ import annotations

import argparse
import functools
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vlmrl.preprocess.common import (
    INSTRUCTION_FOLLOWING,
    ImageRules,
    PreprocessError,
    RecordError,
    build_record,
    check_image,
    check_placeholders,
    image_struct,
    record_features,
    require_text,
)
from vlmrl.preprocess.pipeline import (
    Item,
    SplitResult,
    add_common_args,
    cli_main,
    image_rules,
    run_split,
    write_report,
)

DEFAULT_HUB_ID = "hiyouga/geometry3k"
DATA_SOURCE = "hiyouga/geometry3k"
"""verl's data_source for Geometry3K (reward functions dispatch on it)."""

_SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}


@dataclass
class SourceSplit:
    """One split of the input: a row count and a way to stream its rows (images as raw ``{bytes, path}``)."""

    name: str
    num_rows: int
    batches: Any
    """Callable returning an iterator of ``pyarrow.Table`` / ``RecordBatch`` batches."""
    where: str
    """Human-readable location for error messages."""

    def rows(self) -> Iterator[dict[str, Any]]:
        """The rows as Python dicts, in order."""
        for batch in self.batches():
            yield from batch.to_pylist()


def _split_of(filename: str) -> str | None:
    stem = Path(filename).name.split(".")[0].lower()
    head = re.split(r"[-_]", stem)[0]
    return _SPLIT_ALIASES.get(head)


def _from_datasets_obj(obj: Any, where: str) -> dict[str, SourceSplit]:
    import datasets

    if isinstance(obj, datasets.Dataset):
        obj = datasets.DatasetDict({"train": obj})
    out = {}
    for name, ds in obj.items():
        arrow = ds.with_format("arrow")
        out[name] = SourceSplit(name, len(ds), functools.partial(arrow.iter, batch_size=256), f"{where} [{name}]")
    return out


def _from_parquet(files: list[Path], where: str) -> dict[str, SourceSplit]:
    groups: dict[str, list[Path]] = {}
    for f in sorted(files):
        split = _split_of(f.name)
        if split is None:
            raise PreprocessError(f"{f}: cannot tell its split from its name (expected train*, validation*, test*)")
        groups.setdefault(split, []).append(f)

    def batches(paths: list[Path]) -> Iterator[pa.RecordBatch]:
        for p in paths:
            yield from pq.ParquetFile(p).iter_batches(batch_size=256)

    return {
        s: SourceSplit(
            s, sum(pq.ParquetFile(p).metadata.num_rows for p in ps), functools.partial(batches, ps), f"{where} [{s}]"
        )
        for s, ps in groups.items()
    }


def load_source(input: str) -> dict[str, SourceSplit]:
    """The splits of a hub id, a ``save_to_disk`` folder, a folder of parquet files or one parquet file."""
    import datasets

    p = Path(input).expanduser()
    if p.is_file():
        if p.suffix != ".parquet":
            raise PreprocessError(f"{p}: expected a .parquet file or a folder")
        return _from_parquet([p], str(p))
    if p.is_dir():
        if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
            return _from_datasets_obj(datasets.load_from_disk(str(p)), str(p))
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise PreprocessError(f"{p}: no dataset here (neither a save_to_disk folder nor parquet files)")
        return _from_parquet(files, str(p))
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", input):
        raise PreprocessError(f"{input}: no such file or folder")
    advice = (
        f"Pass a local copy instead: --input DIR, where DIR was written by datasets.load_dataset({input!r})"
        ".save_to_disk(DIR) on a machine with access, or holds the dataset's parquet files "
        "(e.g. DIR/data/train-00000-of-00001.parquet)."
    )
    if not datasets.config.HF_HUB_OFFLINE:
        _probe_hub(input, advice)
    try:
        dd = datasets.load_dataset(input)
    except Exception as e:  # noqa: BLE001 - any hub/network failure gets the same advice
        raise PreprocessError(
            f"could not load {input!r} from the Hugging Face Hub ({type(e).__name__}: {str(e)[:300]}). "
            f"This machine may have no access to the Hub. {advice}"
        ) from None
    return _from_datasets_obj(dd, input)


def _probe_hub(repo_id: str, advice: str) -> None:
    """Fail in about a second, not after minutes of retries, when the Hub cannot be reached at all."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    try:
        huggingface_hub.HfApi().dataset_info(repo_id, timeout=10)
    except HfHubHTTPError:
        return  # the Hub answered (not found, gated...): load_dataset gives the precise error
    except Exception as e:  # noqa: BLE001 - DNS, connection refused, proxy, timeout
        raise PreprocessError(
            f"cannot reach the Hugging Face Hub to load {repo_id!r} ({type(e).__name__}: {str(e)[:200]}). "
            f"If the dataset is in the local cache, rerun with HF_HUB_OFFLINE=1. {advice}"
        ) from None


@dataclass(frozen=True)
class Geo3kOptions:
    """What decides one record (picklable: shipped to worker processes)."""

    split: str
    data_source: str
    instruction: str
    problem_key: str
    answer_key: str
    image_key: str
    store_paths: bool
    output_dir: str
    rules: ImageRules


def build_row(payload: tuple[int, dict[str, Any]], opts: Geo3kOptions) -> dict[str, Any]:
    """One Geometry3K row → one verl record (raises ``RecordError`` for a bad row)."""
    index, row = payload
    if not isinstance(row, dict):
        raise RecordError("invalid_record", f"row is {type(row).__name__}")
    problem = require_text(row.get(opts.problem_key), opts.problem_key, "empty_question")
    answer = require_text(row.get(opts.answer_key), opts.answer_key, "empty_answer")
    images = row.get(opts.image_key)
    if images is None:
        raise RecordError("missing_field", f"{opts.image_key} is missing")
    if isinstance(images, dict):
        images = [images]
    check_placeholders(problem, len(images))
    structs = []
    for k, im in enumerate(images):
        if not isinstance(im, dict):
            raise RecordError("invalid_record", f"{opts.image_key}[{k}] is {type(im).__name__}, not {{bytes, path}}")
        checked = check_image(im.get("bytes"), im.get("path"), opts.rules)
        structs.append(
            image_struct(
                checked,
                source_path=im.get("path") if not im.get("bytes") else None,
                source_name=im.get("path"),
                store_paths=opts.store_paths,
                output_dir=opts.output_dir,
                spill_name=f"{opts.split}/{index:07d}_{k}",
            )
        )
    return build_record(
        data_source=opts.data_source,
        question=problem,
        answer=answer,
        images=structs,
        split=opts.split,
        index=index,
        ability="math",
        instruction=opts.instruction,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=DEFAULT_HUB_ID, help="hub id, save_to_disk folder, parquet folder or file")
    add_common_args(p)
    p.add_argument("--splits", default="train,test", help="comma list of splits to write (train,validation,test)")
    p.add_argument("--data-source", default=DATA_SOURCE, help="data_source written in every record")
    p.add_argument("--instruction", default=INSTRUCTION_FOLLOWING, help="text appended to the problem after a space")
    p.add_argument("--problem-key", default="problem")
    p.add_argument("--answer-key", default="answer")
    p.add_argument("--image-key", default="images")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point: load the source, build and validate records per split, write parquet and the report."""
    a = parse_args(argv)
    started = time.perf_counter()
    source = load_source(a.input)
    wanted = [s.strip() for s in a.splits.split(",") if s.strip()]
    missing = [s for s in wanted if s not in source]
    if missing:
        raise PreprocessError(f"{a.input}: no split(s) {missing}; it has {sorted(source)}")
    features = record_features()
    results: list[SplitResult] = []
    local = Path(a.input).expanduser()  # a local copy: image paths in rows may name files inside it; a hub id: none
    rules = image_rules(a, (local if local.is_dir() else local.parent) if local.exists() else None)
    for split in wanted:
        src = source[split]
        opts = Geo3kOptions(
            split,
            a.data_source,
            a.instruction,
            a.problem_key,
            a.answer_key,
            a.image_key,
            a.store_paths,
            str(a.output_dir),
            rules,
        )
        items = (Item(f"{src.where} row {i}", (i, row)) for i, row in enumerate(src.rows()))
        results.append(
            run_split(
                split,
                items,
                functools.partial(build_row, opts=opts),
                Path(a.output_dir) / f"{split}.parquet",
                features,
                total=src.num_rows,
                num_proc=a.num_proc,
                strict=a.strict,
                progress=not a.no_progress,
                row_group_size=a.row_group_size,
            )
        )
    config = {"input": a.input, "splits": wanted, "data_source": a.data_source, "store_paths": a.store_paths}
    return write_report(a.output_dir, results, name="geo3k", config=config, started=started)


if __name__ == "__main__":
    from vlmrl.procs import lean_exit

    lean_exit()
    raise SystemExit(cli_main(main))
