"""``RLDataset``: verl-schema parquet files → ``PromptSample`` (chat, prompt ids with one image pad per image and one
video pad per video, resized images and video frames), decoded lazily.

At construction every record is checked and measured cheaply: chats are built and rendered, tokenised in batches,
and image and video token counts come from headers only (no pixel decoding). Overlong prompts are filtered and
counted; a prompt holding images or videos is never truncated. ``ds[i]`` then decodes and resizes that record's
images and video frames once with qwen-vl-utils' rules; the same resized frames go to the rollout engine and the
trainer's processor.

Memory stays bounded however large the files: the non-media columns are kept as Arrow tables (text), the image and
video columns are read one row group at a time through a small LRU, and nothing decoded is kept.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from vlmrl.batch import PromptSample
from vlmrl.config.schema import CHOICES, DataConfig
from vlmrl.data.parquet import LRU, ParquetSource, normalize_files
from vlmrl.data.records import (
    DataError,
    build_messages,
    count_videos,
    decode_image,
    ground_truth_problem,
    image_size,
    where,
)
from vlmrl.data.template import ChatRenderer
from vlmrl.data.video import VideoEntry, VideoRules, build_video, timestamp_tokens, video_tokens
from vlmrl.models import qwen_vl
from vlmrl.models.families import family_of_processor
from vlmrl.timing import Timer
from vlmrl.tools import hermes

TRUNCATION_MODES = CHOICES["data.truncation"]
"""``data.truncation`` values: what happens to an overlong text-only prompt that is not filtered."""

_SCAN_BATCH = 512  # rows per construction-time scan batch (bounded memory, batched tokenisation)

REWARD_KEY = "reward_model"
"""Column holding ``{style, ground_truth}``: every rule-scored record needs a non-empty ground truth."""


class RLDataset:
    """Prompts for RL from verl-schema parquet files.

    ``ds[i]`` → ``PromptSample`` (lazy: decode + resize on access). ``ds.report`` says what construction found (rows
    read, filtered overlong with reason counts, truncations); it is printed once.

    Raises ``DataError`` naming file and row for a broken record: a ``<image>`` (``<video>``) count that differs
    from the image (video) count, an unreadable/corrupt image or video or one refused by the decompression-bomb
    guards, an overlong prompt with images or videos when ``data.filter_overlong_prompts`` is off, an overlong
    text-only prompt with ``data.truncation=error``.
    """

    def __init__(
        self,
        files: Any,
        processor: Any,
        data_cfg: DataConfig,
        split: str = "train",
        *,
        cache_row_groups: int = 2,
        verbose: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        sw = Timer.start()
        self.files = normalize_files(files)
        if not self.files:
            raise ValueError(f"no data files given for the {split} split")
        self.split = split
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.prompt_key = data_cfg.prompt_key
        self.image_key = data_cfg.image_key
        self.max_prompt_length = int(data_cfg.max_prompt_length)
        self.filter_overlong = bool(data_cfg.filter_overlong_prompts)
        self.truncation = str(data_cfg.truncation)
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r}; choose one of {', '.join(TRUNCATION_MODES)}")
        self.system_prompt = data_cfg.system_prompt or None
        self.tools = list(tools or [])  # multi-turn: the tools' schemas go into the system message (hermes)
        self.keep_source_images = bool(self.tools)  # ... and tools may look at the images before resizing
        max_samples = data_cfg.train_max_samples if split == "train" else data_cfg.val_max_samples
        self.max_samples = int(max_samples if max_samples is not None else -1)
        self.renderer = ChatRenderer(processor, data_cfg.custom_chat_template)
        ip = self.image_processor = processor.image_processor
        self.family = family_of_processor(processor)
        self.patch_factor = qwen_vl.patch_factor(ip)
        # a tiled family's images go to its processor as they are (its tiles bound them): no pixel bounds
        self.pixel_bounds = (
            None if self.family.tiles else qwen_vl.pixel_bounds(ip, data_cfg.min_pixels, data_cfg.max_pixels)
        )
        vision = qwen_vl.vision_token_ids(self.tokenizer)
        self.image_pad_id, self.video_pad_id = vision.image_pad, vision.video_pad
        self.video_key = data_cfg.video_key
        # (a family vlmrl trains without videos refuses a record that holds one before measuring it)
        self.video_rules = self._video_rules(processor, data_cfg) if self.family.videos else None

        self._pool: Any = None
        self._first_filtered: dict[str, str] = {}
        self._token_lock = threading.Lock()
        self._text_cache = LRU(1024)
        self._ids_cache = LRU(1024)
        self.sources = [ParquetSource(f, self.image_key, cache_row_groups, self.video_key) for f in self.files]
        self._check_columns()
        self._scan(sw)
        if verbose:
            print(self.format_report())

    # ------------------------------------------------------------------------------------------------ construction

    def _video_rules(self, processor: Any, data_cfg: DataConfig) -> VideoRules:
        """How this model's video processor sizes and samples a video (``data.video_*`` bounds)."""
        vp = getattr(processor, "video_processor", None) or processor.image_processor
        family = self.family
        return VideoRules(
            qwen_vl.patch_factor(vp),
            *qwen_vl.pixel_bounds(vp, data_cfg.video_min_pixels, data_cfg.video_max_pixels),
            data_cfg.video_total_pixels,
            qwen_vl.FrameSampling(data_cfg.video_fps, data_cfg.video_min_frames, data_cfg.video_max_frames),
            # Qwen3-VL's timestamps count towards the prompt's length (max_prompt_length, the overlong filter)
            functools.partial(timestamp_tokens, self.tokenizer, family) if family.video_timestamps else None,
        )

    def _check_columns(self) -> None:
        """Every file has the prompt and reward columns, and ``extra_info`` (when present) holds a dict per record."""
        for s in self.sources:
            if self.prompt_key not in s.columns:
                raise DataError(f"{s.path}: no column {self.prompt_key!r} (data.prompt_key); it has {s.columns}")
            if REWARD_KEY not in s.columns:
                raise DataError(
                    f"{s.path}: no column {REWARD_KEY!r} ({{style, ground_truth}}: the answer rewards score against); "
                    f"it has {s.columns}"
                )
            info = s.meta.schema.field("extra_info").type if "extra_info" in s.columns else pa.null()
            if not (pa.types.is_struct(info) or pa.types.is_map(info) or pa.types.is_null(info)):
                raise DataError(f"{s.path}: column 'extra_info' is {info}, expected a struct (a dict per record)")

    def _scan(self, sw: Timer) -> None:
        """Check and measure every record; keep the ones that fit; fill ``self.report``."""
        kept: list[tuple[np.ndarray, ...]] = []  # per chunk: source, row, length, images, videos of the kept
        reasons: Counter[str] = Counter()
        truncated = 0
        rows_read = 0
        for si, src in enumerate(self.sources):
            start = 0
            for entries in src.scan_media(_SCAN_BATCH):
                if self.max_samples >= 0:  # data.{train,val}_max_samples: the first rows only
                    entries = entries[: max(0, self.max_samples - rows_read)]
                    if not entries:
                        break
                rows = np.arange(start, start + len(entries))
                counts, vcounts, length, keep, cut = self._measure(src, start, entries, reasons)
                truncated += cut
                images, videos = np.asarray(counts, dtype=np.int32), np.asarray(vcounts, dtype=np.int32)
                kept.append(
                    (np.full(int(keep.sum()), si, dtype=np.int32), rows[keep], length[keep], images[keep], videos[keep])
                )
                rows_read += len(rows)
                start += len(entries)
        dtypes = (np.int32, np.int64, np.int64, np.int32, np.int32)
        joined = [np.concatenate([k[i] for k in kept]) if kept else np.zeros(0, d) for i, d in enumerate(dtypes)]
        self._src, self._row, self.prompt_lengths, self.num_images, self.num_videos = joined
        """(``prompt_lengths``: tokens, image tokens included; ``num_images``, ``num_videos``: of each kept record.)"""
        self.report: dict[str, Any] = self._report(rows_read, reasons, truncated, sw)

    def _measure(
        self, src: ParquetSource, start: int, entries: list[Any], reasons: Counter[str]
    ) -> tuple[list[int], list[int], np.ndarray, np.ndarray, int]:
        """One chunk of ``src``'s records from row ``start`` (``entries``: their images and videos), checked and
        measured: image and video counts, prompt lengths, which are kept (the others counted in ``reasons``), and
        how many text-only prompts are truncated."""
        stop = start + len(entries)
        prompts = src.meta.column(self.prompt_key).slice(start, stop - start).to_pylist()
        rewards = src.meta.column(REWARD_KEY).slice(start, stop - start).to_pylist()
        texts, counts, vcounts, image_tokens = [], [], [], []
        for k, (prompt, (ents, vents), reward) in enumerate(zip(prompts, entries, rewards)):
            r = start + k
            problem = ground_truth_problem(reward)
            if problem is not None:
                raise DataError(
                    f"{where(src.path, r)}: {problem}; a record without an answer cannot be scored (drop or "
                    "fix it: the preprocess scripts reject such rows into rejects.jsonl)"
                )
            if vents and not self.family.videos:
                raise DataError(
                    f"{where(src.path, r)}: the record holds {len(vents)} video(s); vlmrl trains {self.family.label} "
                    f"on images and text, not videos (the column data.video_key={self.video_key!r})"
                )
            text, n = self._render_checked(src, r, prompt, ents, vents)
            texts.append(text)
            counts.append(n)
            vcounts.append(len(vents))
            tokens = [self._image_tokens(src, r, j, e) for j, e in enumerate(ents)]
            tokens += [self._video_tokens(src, r, j, e) for j, e in enumerate(vents)]
            image_tokens.append(None if None in tokens else sum(tokens))
        ids = self._tokenize(texts)
        length = np.zeros(len(entries), dtype=np.int64)
        keep = np.ones(len(entries), dtype=bool)
        truncated = 0
        for k, (tid, n, nv, itok) in enumerate(zip(ids, counts, vcounts, image_tokens)):
            if itok is None:  # an image these pixel bounds cannot resize: dropped here, not at sampling
                keep[k] = False
                reasons["unresizable_image"] += 1
                continue
            length[k], verdict = self._fit(src, start + k, tid, n, nv, itok)
            if verdict == "truncated":
                truncated += 1
            elif verdict != "kept":
                keep[k] = False
                reasons[verdict] += 1
        return counts, vcounts, length, keep, truncated

    def _fit(self, src: ParquetSource, r: int, tid: list[int], n: int, nv: int, itok: int) -> tuple[int, str]:
        """Record ``r``'s prompt length and what becomes of it: kept, truncated (text only, to the limit) or the
        reason it is filtered; raises for a prompt the settings cannot take (naming the file and row)."""
        for pad_id, what, want in ((self.image_pad_id, "image", n), (self.video_pad_id, "video", nv)):
            pads = sum(1 for t in tid if t == pad_id)
            if pads != want:
                raise DataError(
                    f"{where(src.path, r)}: the rendered prompt has {pads} {what} pad token(s) for {want} "
                    f"{what}(s) (a literal {what} pad in the text, or a chat template that drops {what} parts)"
                )
        length = len(tid) - n - nv + itok
        if length <= self.max_prompt_length:
            return length, "kept"
        if n + nv > 0:
            if not self.filter_overlong:
                raise DataError(
                    f"{where(src.path, r)}: prompt is {length} tokens ({itok} of them image and video "
                    f"tokens) > data.max_prompt_length={self.max_prompt_length}; a prompt with images or "
                    "videos is never truncated: set data.filter_overlong_prompts=true, raise "
                    "max_prompt_length or lower data.max_pixels / data.video_max_pixels"
                )
            return length, "overlong_with_images"
        if self.filter_overlong:
            return length, "overlong_text"
        if self.truncation == "error":
            raise DataError(
                f"{where(src.path, r)}: text-only prompt is {length} tokens > "
                f"data.max_prompt_length={self.max_prompt_length} and data.truncation=error; set "
                "data.filter_overlong_prompts=true or data.truncation=left|right"
            )
        return self.max_prompt_length, "truncated"

    def _report(self, rows_read: int, reasons: Counter[str], truncated: int, sw: Timer) -> dict[str, Any]:
        """What the scan found (``format_report`` prints it)."""
        return {
            "split": self.split,
            "files": list(self.files),
            "rows_read": rows_read,
            "kept": len(self),
            "filtered": sum(reasons.values()),
            "filtered_by_reason": dict(sorted(reasons.items())),
            "first_filtered": dict(self._first_filtered),
            "truncated_text_prompts": truncated,
            "truncation": self.truncation,
            "max_prompt_length": self.max_prompt_length,
            "prompt_length_max": int(self.prompt_lengths.max()) if len(self) else 0,
            "prompt_length_mean": round(float(self.prompt_lengths.mean()), 1) if len(self) else 0.0,
            "max_images_per_prompt": self.max_images_per_prompt,
            "max_videos_per_prompt": self.max_videos_per_prompt,
            "text_only_prompts": int(((self.num_images + self.num_videos) == 0).sum()),
            "pixel_bounds": None if self.pixel_bounds is None else list(self.pixel_bounds),
            "max_samples": self.max_samples,
            "seconds": round(sw.elapsed, 3),
        }

    def _render_checked(
        self, src: ParquetSource, r: int, prompt: Any, entries: list[Any], videos: list[VideoEntry]
    ) -> tuple[str, int]:
        try:
            messages, n = build_messages(prompt, self.system_prompt)
        except TypeError as e:
            raise DataError(f"{where(src.path, r)}: bad {self.prompt_key!r} column value: {e}") from None
        if n != len(entries):
            missing = "" if src.has_images else f" (the file has no column {self.image_key!r}: data.image_key)"
            raise DataError(
                f"{where(src.path, r)}: {n} <image> placeholder(s) in the prompt but {len(entries)} image(s) "
                f"in column {self.image_key!r}{missing}"
            )
        nv = count_videos(messages)
        if nv != len(videos):
            missing = "" if src.has_videos else f" (the file has no column {self.video_key!r}: data.video_key)"
            raise DataError(
                f"{where(src.path, r)}: {nv} <video> placeholder(s) in the prompt but {len(videos)} video(s) "
                f"in column {self.video_key!r}{missing}"
            )
        try:
            return self._render(messages), n
        except Exception as e:  # noqa: BLE001 - a template error names the record
            raise DataError(f"{where(src.path, r)}: chat template failed: {type(e).__name__}: {e}") from None

    def _image_tokens(self, src: ParquetSource, r: int, j: int, entry: Any) -> int | None:
        """Image tokens of an image (from its header), or None when these pixel bounds cannot resize it (the row is
        then filtered and counted, its first occurrence named in the report)."""
        try:
            w, h = image_size(entry, src.base_dir)
        except DataError as e:
            raise DataError(f"{where(src.path, r)}: image {j}: {e}") from None
        if self.pixel_bounds is None:  # a tiled family: the tiles its processor cuts
            return self.family.tiles.image_tokens(self.processor, w, h)  # type: ignore[union-attr]
        try:
            return qwen_vl.num_image_tokens(w, h, self.patch_factor, *self.pixel_bounds)
        except ValueError as e:  # aspect ratio over 200, or a side below one patch after resizing
            self._first_filtered.setdefault("unresizable_image", f"{where(src.path, r)}: image {j}: {e}")
            return None

    def _video_tokens(self, src: ParquetSource, r: int, j: int, entry: VideoEntry) -> int | None:
        """Video tokens of a video (from headers), or None when its frames cannot be resized within the bounds (the
        row is then filtered and counted like an unresizable image)."""
        try:
            return video_tokens(entry, src.base_dir, self.video_rules)
        except DataError as e:
            raise DataError(f"{where(src.path, r)}: video {j}: {e}") from None
        except ValueError as e:
            self._first_filtered.setdefault("unresizable_image", f"{where(src.path, r)}: video {j}: {e}")
            return None

    def _render(self, messages: list[dict[str, Any]]) -> str:
        """The chat template's text for ``messages`` (cached: many datasets repeat prompts)."""
        key = repr(messages)
        text = self._text_cache.get(key)
        if text is None:
            if self.tools and not self.renderer.takes_tools:  # the template cannot list them: hermes, by hand
                messages = list(messages)
                first = messages[0] if messages else {}
                if first.get("role") == "system" and isinstance(first.get("content"), str):
                    messages[0] = {**first, "content": hermes.system_prompt(self.tools, first["content"])}
                else:
                    messages.insert(0, {"role": "system", "content": hermes.system_prompt(self.tools)})
            text = self.renderer.render(messages, self.tools)
            self._text_cache.put(key, text)
        return text

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many prompt texts (identical texts are tokenised once)."""
        unique = list(dict.fromkeys(texts))
        ids = self.tokenizer(unique, add_special_tokens=False)["input_ids"] if unique else []
        table = dict(zip(unique, ids))
        return [table[t] for t in texts]

    # --------------------------------------------------------------------------------------------------- access

    def __len__(self) -> int:
        return len(self._row)

    @property
    def max_images_per_prompt(self) -> int:
        """The most images any kept prompt holds (the engine's ``limit_mm_per_prompt``)."""
        return int(self.num_images.max()) if len(self) else 0

    @property
    def max_videos_per_prompt(self) -> int:
        """The most videos any kept prompt holds (the engine's ``limit_mm_per_prompt``)."""
        return int(self.num_videos.max()) if len(self) else 0

    def source_of(self, index: int) -> tuple[str, int]:
        """(file, row) of a kept record."""
        return self.sources[int(self._src[index])].path, int(self._row[index])

    def __getitem__(self, index: int) -> PromptSample:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} prompts")
        index = int(index) % len(self)
        src = self.sources[int(self._src[index])]
        r = int(self._row[index])
        try:
            return self._build(index, src, r)
        except DataError as e:
            msg = str(e)
            raise DataError(msg if msg.startswith(src.path) else f"{where(src.path, r)}: {msg}") from None

    def get_batch(self, indices: Sequence[int], num_workers: int = 0) -> list[PromptSample]:
        """``[ds[i] for i in indices]``; with ``num_workers`` > 1 the records are built on that many threads (Pillow
        releases the GIL while decoding and resizing, so this scales with cores). Same result, same order."""
        if num_workers <= 1 or len(indices) <= 1:
            return [self[int(i)] for i in indices]
        pool = self._pool
        if pool is None or pool._max_workers != num_workers:
            from concurrent.futures import ThreadPoolExecutor

            if pool is not None:
                pool.shutdown(wait=False)
            pool = self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="vlmrl-data")
        return list(pool.map(self.__getitem__, [int(i) for i in indices]))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state.pop("_token_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._token_lock = threading.Lock()

    def _build(self, index: int, src: ParquetSource, r: int) -> PromptSample:
        row = src.row(r)
        entries = src.images(r)
        messages, n = build_messages(row[self.prompt_key], self.system_prompt)
        if n != len(entries):
            raise DataError(f"{n} <image> placeholder(s) but {len(entries)} image(s)")
        images, sizes, sources = self._images(src, entries)
        videos = []
        for j, entry in enumerate(src.videos(r)):
            try:
                videos.append(build_video(entry, src.base_dir, self.video_rules))
            except (DataError, ValueError) as e:
                raise DataError(f"video {j}: {e}") from None
        if count_videos(messages) != len(videos):
            raise DataError(f"{count_videos(messages)} <video> placeholder(s) but {len(videos)} video(s)")
        with self._token_lock:  # a fast tokenizer must not be entered from two threads at once ("Already borrowed")
            prompt_text = self._render(messages)
            ids = self._ids_cache.get(prompt_text)
            if ids is None:
                try:
                    ids = tuple(qwen_vl.engine_prompt_ids(self.tokenizer, prompt_text, n, len(videos)))
                except ValueError as e:
                    raise DataError(str(e)) from None
                self._ids_cache.put(prompt_text, ids)
        ids = list(ids)
        if n == 0 and not videos and len(ids) > self.max_prompt_length:
            if self.truncation == "error":  # only reachable when the files changed since construction
                raise DataError(f"text-only prompt is {len(ids)} tokens > {self.max_prompt_length}")
            ids = ids[-self.max_prompt_length :] if self.truncation == "left" else ids[: self.max_prompt_length]
            with self._token_lock:
                prompt_text = self.tokenizer.decode(ids, skip_special_tokens=False)
        reward = row.get("reward_model") or {}
        return PromptSample(
            index=index,
            uid=f"{src.path}:{r}",
            data_source=str(row.get("data_source") or "unknown"),
            messages=messages,
            prompt_text=prompt_text,
            prompt_ids=ids,
            images=images,
            original_sizes=[(int(w), int(h)) for w, h in sizes],
            ground_truth=reward.get("ground_truth") if isinstance(reward, dict) else None,
            extra_info=dict(row.get("extra_info") or {}),
            source_images=sources,
            videos=videos,
        )

    def _images(self, src: ParquetSource, entries: list[Any]) -> tuple[list[Any], list[tuple[int, int]], list[Any]]:
        """A record's images decoded and resized to the pixel bounds (a tiled family's: as decoded); their original
        sizes; and, for the tools, the images as they were (RGB) when resizing changed them."""
        images, sizes, sources = [], [], []
        for j, entry in enumerate(entries):
            try:
                raw = decode_image(entry, src.base_dir)
                sizes.append(raw.size)
                bounds = self.pixel_bounds
                resized = raw if bounds is None else qwen_vl.resize_image(raw, self.patch_factor, *bounds)
                images.append(resized)
                if self.keep_source_images and resized.size != raw.size:
                    sources.append(raw)  # RGB (decode_image), kept for the tools
                else:
                    sources += [resized] if self.keep_source_images else []
                    if resized is not raw:  # (a tiled family's image goes on as decoded)
                        raw.close()
            except DataError as e:
                raise DataError(f"image {j}: {e}") from None
            except ValueError as e:
                raise DataError(f"image {j}: {e}") from None
        return images, sizes, sources

    # --------------------------------------------------------------------------------------------------- report

    def format_report(self) -> str:
        """The construction report as one or two lines of text."""
        r = self.report
        why = ", ".join(f"{k}: {v}" for k, v in r["filtered_by_reason"].items())
        text = (
            f"[data:{r['split']}] {r['rows_read']} rows from {len(r['files'])} file(s) -> {r['kept']} prompts; "
            f"filtered {r['filtered']}"
            + (f" ({why}; max_prompt_length {r['max_prompt_length']})" if why else "")
            + f"; prompt length max {r['prompt_length_max']} mean {r['prompt_length_mean']}; "
            f"max images/prompt {r['max_images_per_prompt']}"
            + (f", videos/prompt {r['max_videos_per_prompt']}" if r.get("max_videos_per_prompt") else "")
            + f"; {r['seconds']:.2f} s"
        )
        for reason, example in r.get("first_filtered", {}).items():
            text += f"\n[data:{r['split']}] filtered as {reason}, e.g. {example}"
        if r["truncated_text_prompts"]:
            n, mode = r["truncated_text_prompts"], r["truncation"]
            text += f"\n[data:{r['split']}] truncated {n} overlong text-only prompts (data.truncation={mode})"
        return text
