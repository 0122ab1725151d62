"""Reading verl-schema parquet files with bounded memory: a file's text columns as Arrow tables, its image and video
columns one row group at a time through a small LRU (``ParquetSource``), and the column checks that name file, row
and key.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlmrl.data.records import DataError, image_entries, where
from vlmrl.data.video import VideoEntry, video_entries


class LRU:
    """A small thread-safe least-recently-used cache (prompt renderings and token ids repeat across records and
    epochs)."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.data: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self.lock:
            value = self.data.get(key)
            if value is not None:
                self.data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.data[key] = value
            if len(self.data) > self.maxsize:
                self.data.popitem(last=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["maxsize"])


def normalize_files(files: Any) -> list[str]:
    """``data.train_files`` as a list of paths (a path, a list, a tuple or an OmegaConf ListConfig)."""
    if files is None:
        return []
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    return [os.fspath(f) for f in files]


class ParquetSource:
    """One parquet file: non-media columns in memory as an Arrow table; the image and video columns read a row group
    at a time (memory-mapped file, LRU of ``cache_row_groups`` groups, Arrow buffers only: nothing decoded is kept)."""

    def __init__(self, path: str, image_key: str, cache_row_groups: int = 2, video_key: str | None = None) -> None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"data file not found: {path}")
        self.path = path
        self.base_dir = str(Path(path).resolve().parent)
        self.image_key = image_key
        self.video_key = video_key
        self.cache_row_groups = max(1, cache_row_groups)
        try:
            pf = self._file()
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        md = pf.metadata
        self.num_rows = md.num_rows
        self.columns = pf.schema_arrow.names
        self.has_images = image_key in self.columns
        self.has_videos = video_key is not None and video_key in self.columns and video_key != image_key
        if self.has_images:
            check_image_column(pf.schema_arrow.field(image_key).type, path, image_key)
        if self.has_videos:
            check_video_column(pf.schema_arrow.field(video_key).type, path, str(video_key))
        self.media_keys = [k for k, on in ((image_key, self.has_images), (video_key, self.has_videos)) if on]
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.group_starts = np.cumsum([0, *sizes])
        self.meta = pf.read(columns=[c for c in self.columns if c not in self.media_keys])
        self._cache: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()
        for name in self.meta.column_names:
            check_text(self.meta.column(name), self.path, name)

    def _file(self) -> pq.ParquetFile:
        pf = getattr(self, "_pf", None)
        if pf is None:
            pf = self._pf = pq.ParquetFile(self.path, memory_map=True)
        return pf

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_pf", None)
        state["_cache"] = OrderedDict()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def row(self, r: int) -> dict[str, Any]:
        """The non-media columns of row ``r`` as Python values."""
        return self.meta.slice(r, 1).to_pylist()[0]

    def _media(self, r: int, key: str) -> Any:
        g = int(np.searchsorted(self.group_starts, r, side="right")) - 1
        with self._lock:
            table = self._cache.get(g)
            if table is None:
                table = self._file().read_row_group(g, columns=self.media_keys)
                self._cache[g] = table
                while len(self._cache) > self.cache_row_groups:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(g)
        return table.column(key)[r - int(self.group_starts[g])].as_py()

    def images(self, r: int) -> list[Any]:
        """The image entries (``{bytes, path}`` structs) of row ``r``."""
        return image_entries(self._media(r, self.image_key)) if self.has_images else []

    def videos(self, r: int) -> list[VideoEntry]:
        """The video entries of row ``r``."""
        return video_entries(self._media(r, str(self.video_key))) if self.has_videos else []

    def scan_media(self, batch_size: int) -> Any:
        """``(image entries, video entries)`` of every row, in order, one batch at a time (construction-time scan;
        bypasses the LRU).

        Raises ``DataError`` naming file, row and column for a value that is not images (videos) or a path that is
        not UTF-8."""
        if not self.media_keys:
            for start in range(0, self.num_rows, batch_size):
                yield [([], []) for _ in range(min(batch_size, self.num_rows - start))]
            return
        start = 0
        for batch in self._file().iter_batches(batch_size=batch_size, columns=self.media_keys):
            cols: dict[str, list[Any]] = {}
            for key, parse in ((self.image_key, image_entries), (self.video_key, video_entries)):
                if key not in self.media_keys:
                    continue
                col = batch.column(self.media_keys.index(key))
                check_text(col, self.path, key, start)
                cols[key] = []
                for k, value in enumerate(col.to_pylist()):
                    try:
                        cols[key].append(parse(value))
                    except DataError as e:
                        raise DataError(f"{where(self.path, start + k)}: column {key!r}: {e}") from None
            n = batch.num_rows
            imgs = cols.get(self.image_key, [[] for _ in range(n)])
            vids = cols.get(str(self.video_key), [[] for _ in range(n)])
            yield list(zip(imgs, vids))
            start += n


def check_image_column(kind: pa.DataType, path: str, key: str) -> None:
    """Raise ``DataError`` naming the key and the file when the image column cannot hold images: a list of
    ``{bytes, path}`` structs (verl's schema), of binary images or of path strings; one struct or binary per row."""

    def image_like(t: pa.DataType) -> bool:
        if pa.types.is_struct(t):
            return t.get_field_index("bytes") >= 0 or t.get_field_index("path") >= 0
        return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_null(t)

    ok = (
        image_like(kind)
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind))
        else image_like(kind.value_type)
    )
    if not ok or pa.types.is_string(kind):
        raise DataError(
            f"{path}: data.image_key={key!r} names a column of type {kind}, not images; verl's schema stores a list of "
            "{bytes, path} structs per record (set data.image_key to the image column)"
        )


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


_FRAME_TYPES = (
    pa.types.is_null,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_large_binary,
)


def _frame_like(t: pa.DataType) -> bool:
    """A frame of a list of frames: a path, image bytes or a ``{bytes, path}`` struct."""
    if pa.types.is_struct(t):
        return t.get_field_index("bytes") >= 0 or t.get_field_index("path") >= 0
    return any(is_type(t) for is_type in _FRAME_TYPES)


def check_video_column(kind: pa.DataType, path: str, key: str) -> None:
    """Raise ``DataError`` naming the key and the file when the video column cannot hold videos: a list of structs
    (vlmrl's ``{frames | video, ...}``, verl's ``{video, ...}``), of path strings (a video file each) or of lists of
    frames (EasyR1's ``[[frame paths], ...]``: a list of frames each, as verl's ``{"video": [frame paths]}``)."""
    inner = kind.value_type if _is_list(kind) else None
    ok = inner is not None and (
        pa.types.is_null(inner)
        or pa.types.is_string(inner)
        or pa.types.is_large_string(inner)
        or (pa.types.is_struct(inner) and (inner.get_field_index("frames") >= 0 or inner.get_field_index("video") >= 0))
        or (_is_list(inner) and _frame_like(inner.value_type))
    )
    if not ok:
        raise DataError(
            f"{path}: data.video_key={key!r} names a column of type {kind}, not videos; a record's videos are a list "
            "of {frames | video, ...} structs, of video paths or of lists of frame paths (set data.video_key to the "
            "video column)"
        )


def check_text(col: pa.Array | pa.ChunkedArray, path: str, name: str, first_row: int = 0) -> None:
    """Raise ``DataError`` naming file, row and column when a string in ``col`` is not valid UTF-8 (parquet stores
    strings unchecked; Python would fail on them later, naming nothing). ``first_row`` is the row of ``col[0]``."""
    try:
        col.validate(full=True)
        return
    except pa.ArrowInvalid as e:
        problem = str(e)
    for r in range(len(col)):
        try:
            col[r].as_py()
        except UnicodeDecodeError as e:
            raise DataError(
                f"{where(path, first_row + r)}: column {name!r} holds text that is not valid UTF-8 ({e.reason}: "
                f"byte 0x{e.object[e.start : e.start + 1].hex()} at byte {e.start + 1})"
            ) from None
    raise DataError(f"{path}: column {name!r} is not valid: {problem}")
