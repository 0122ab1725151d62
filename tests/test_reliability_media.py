"""Media paths and videos under stress (issue 32, round three): high-resolution video decoded with bounded memory and
the same pixels, frame lists checked frame by frame when the dataset is built (and so in the dry run), symlink loops
and NUL bytes in paths as named errors and counted rejects, EasyR1's video rows, and the dry run's description of
image, video and text-only columns."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from utils import write_mp4

from vlmrl import dry_run
from vlmrl.config import DataConfig, load
from vlmrl.data import DataError, RLDataset
from vlmrl.data.video import VideoRules, build_video, parse_entry
from vlmrl.models import qwen_vl
from vlmrl.preprocess import jsonl

HD = (1920, 1080)
"""Source frame size of the high-resolution clip (6 MB a frame as RGB)."""

HD_FRAMES = 64
"""Frames of the clip, all sampled: kept at source size they take about 380 MB."""

BOUNDED = 20
"""Source-size frames' worth of memory decoding the clip may take (the frame being resized, the decoder's buffers)."""


def load_ds(files: Any, processor: Any, **kw: Any) -> RLDataset:
    """An ``RLDataset`` of ``files`` with the test's data config."""
    return RLDataset(files, processor, DataConfig(train_files=files, max_prompt_length=512, **kw), verbose=False)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> str:
    """Rows (prompt text, optional ``images`` / ``videos``) as a verl-schema parquet file at ``path``."""
    media = [k for k in ("images", "videos") if any(k in r for r in rows)]
    recs = [
        {
            "data_source": "synthetic/colour",
            "prompt": [{"role": "user", "content": r["q"]}],
            **{k: r.get(k) for k in media},
            "reward_model": {"style": "rule", "ground_truth": "red"},
        }
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(recs), path)
    return str(path)


def write_hd_clip(path: Path, frames: int = HD_FRAMES, size: tuple[int, int] = HD) -> Path:
    """A high-resolution MPEG-4 clip at 10 fps: a gradient with a red bar moving over it."""
    import av

    w, h = size
    base = np.zeros((h, w, 3), np.uint8)
    base[:, :, 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    base[:, :, 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    with av.open(str(path), "w") as out:
        s = out.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt, s.bit_rate = w, h, "yuv420p", 2_000_000
        for i in range(frames):
            a = base.copy()
            x = (i * 37) % (w // 2)
            a[h // 4 : h // 2, x : x + w // 8] = (255, 0, 0)
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return path


def reference_frames(path: Path, indices: list[int], size: tuple[int, int]) -> list[np.ndarray]:
    """What the old path gave: every sampled frame decoded at source size, then resized (bicubic) to ``size``."""
    import av

    got = {}
    with av.open(str(path)) as c:
        for k, frame in enumerate(c.decode(video=0)):
            if k in indices:
                got[k] = frame.to_image().convert("RGB").resize(size, Image.Resampling.BICUBIC)
    return [np.asarray(got[i]) for i in indices]


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and how far this process's resident memory rose above where it was (bytes; sampled every 2 ms on a
    thread: tracemalloc does not see PyAV's or Pillow's buffers)."""
    import gc

    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * page

    gc.collect()
    base = peak = rss()
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss())
            done.wait(0.002)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        out = fn()
        peak = max(peak, rss())
    finally:
        done.set()
        t.join()
    return out, peak - base


@pytest.fixture()
def media(tmp_path: Path) -> Path:
    """A data folder: a small clip, three frames, a still image, a symlink loop; a clip outside it."""
    m = tmp_path / "media"
    m.mkdir()
    write_mp4(m / "clip.mp4")
    for k in range(3):
        Image.new("RGB", (56, 56), (60 * k, 0, 200)).save(m / f"f{k}.png")
    Image.new("RGB", (40, 30), "red").save(m / "still.png")
    (m / "loop.png").symlink_to("loop.png")  # resolving it never ends
    write_mp4(tmp_path / "outside.mp4")
    Image.new("RGB", (56, 56), "blue").save(tmp_path / "outside.png")
    return m


# ------------------------------------------------------------------------------- 1. high-resolution video memory

needs_proc = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm (Linux)")


@needs_proc
def test_preprocessing_a_high_resolution_video_keeps_one_source_frame_not_all(tmp_path: Path) -> None:
    """Issue 32: every sampled frame was kept decoded at full size before resizing (160 4K frames: 6.4 GB). Frames
    are resized as they are decoded now: memory grows with the output, and the stored frames are the old path's."""
    write_hd_clip(tmp_path / "hd.mp4")
    write_hd_clip(tmp_path / "small.mp4", size=(64, 48))

    def args(name: str) -> list[str]:
        src = tmp_path / f"{name}.jsonl"
        src.write_text(json.dumps({"question": "<video>Which way?", "answer": "right", "videos": [f"{name}.mp4"]}))
        return [
            "--input",
            str(src),
            "--image-dir",
            str(tmp_path),
            "--output-dir",
            str(tmp_path / name),
            "--no-progress",
            "--video-nframes",
            str(HD_FRAMES),
            "--video-min-pixels",
            "3136",
            "--video-max-pixels",
            "12544",
        ]

    jsonl.main(args("small"))  # imports and first-use allocations, not measured
    report, grew = peak_rss_growth(lambda: jsonl.main(args("hd")))
    assert report["splits"]["train"]["written"] == 1
    # the old path held all 64 source frames at once (540 MB measured); now one and the decoder's (55 MB)
    assert grew < BOUNDED * HD[0] * HD[1] * 3, f"memory rose {grew / 2**20:.0f} MB decoding {HD_FRAMES} frames of {HD}"
    (video,) = pq.read_table(tmp_path / "hd" / "train.parquet").to_pylist()[0]["videos"]
    assert video["frames_indices"] == list(range(HD_FRAMES))
    size = qwen_vl.video_frame_size(*HD, HD_FRAMES, 28, 3136, 12544, None)
    want = reference_frames(tmp_path / "hd.mp4", video["frames_indices"], size)
    got = [np.asarray(Image.open(io.BytesIO(f["bytes"]))) for f in video["frames"]]
    assert len(got) == HD_FRAMES and all(np.array_equal(a, b) for a, b in zip(got, want))  # the same pixels


@needs_proc
def test_training_decodes_a_high_resolution_video_file_with_bounded_memory(tmp_path: Path) -> None:
    """The dataset decodes a video file the same way (verl's ``{"video": ...}`` entries, ``--store-paths`` data):
    resized as decoded, the same frames and the same source size as before."""
    write_hd_clip(tmp_path / "hd.mp4")
    rules = VideoRules(28, 3136, 12544, None, qwen_vl.FrameSampling(nframes=HD_FRAMES))
    write_hd_clip(tmp_path / "small.mp4", size=(64, 48))
    build_video(parse_entry({"video": "small.mp4"}), tmp_path, rules)  # first-use allocations, not measured
    entry = parse_entry({"video": "hd.mp4"})
    video, grew = peak_rss_growth(lambda: build_video(entry, tmp_path, rules))
    assert grew < BOUNDED * HD[0] * HD[1] * 3, f"memory rose {grew / 2**20:.0f} MB"
    size = qwen_vl.video_frame_size(*HD, HD_FRAMES, 28, 3136, 12544, None)
    want = reference_frames(tmp_path / "hd.mp4", list(range(HD_FRAMES)), size)
    assert video.original_size == HD and [f.size for f in video.frames] == [size] * HD_FRAMES
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(video.frames, want))


def test_frame_lists_are_resized_as_read_with_the_same_pixels(media: Path) -> None:
    """A list of frame files: each frame resized as it is read (the first frame's size sets the target, as before);
    the pixels are those resizing the full-size frames gives, odd counts padded by repeating the last."""
    for k, size in enumerate([(640, 480), (640, 480), (600, 500)]):  # a frame of another size is resized too
        Image.effect_noise(size, 80).convert("RGB").save(media / f"big{k}.png")
    rules = VideoRules(28, 3136, 12544, None, qwen_vl.FrameSampling())
    video = build_video(parse_entry({"video": ["big0.png", "big1.png", "big2.png"]}), media, rules)
    size = qwen_vl.video_frame_size(640, 480, 3, 28, 3136, 12544, None)
    want = [Image.open(media / f"big{k}.png").convert("RGB").resize(size, Image.Resampling.BICUBIC) for k in range(3)]
    assert video.original_size == (640, 480) and [f.size for f in video.frames] == [size] * 4
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(video.frames, [*want, want[-1]]))
    assert video.timestamps == [0.0, 0.5, 1.0, 1.0]


# ----------------------------------------------------------------------- 2. every frame of a frame list checked


def cfg_of(model: str, data: str, tmp: Path, *extra: str) -> Any:
    """The tiny CPU config on ``data`` (train and validation)."""
    return load(
        [
            f"data.train_files={data}",
            f"data.val_files={data}",
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={tmp / 'run'}",
            "trainer.total_training_steps=1",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            *extra,
        ],
        config_name="tiny_cpu",
    )


@pytest.mark.parametrize("second", ["nope.png", "../outside.png"])
def test_a_bad_later_frame_is_named_when_the_dataset_is_built_and_in_the_dry_run(
    media: Path, tmp_path: Path, second: str, tiny_model_dir: str, tiny_processor: Any, capsys: Any
) -> None:
    """Only the first frame of a frame list was read before training (for its size): a missing or outside 2nd frame
    passed the dry run and stopped training at step 1. Every frame is checked when the dataset is built now."""
    rows = [
        {"q": "<video>Q?", "videos": [{"video": ["f0.png", "f1.png"]}]},
        {"q": "<video>Q?", "videos": [{"video": ["f0.png", second]}]},
    ]
    path = write_rows(media / "frames.parquet", rows)
    why = "image file not found" if second == "nope.png" else "leaves the data folder"
    with pytest.raises(DataError, match=f"{path} row 1: video 0: frame 1: .*{why}"):
        load_ds(path, tiny_processor)
    rc = dry_run.run(cfg_of(tiny_model_dir, path, tmp_path), [], [])
    out = capsys.readouterr().out
    assert rc == dry_run.EXIT_PROBLEMS, out
    problems = out.split("the run would not start:")[1]
    assert f"{path} row 1: video 0: frame 1: " in problems and why in problems
    verl = write_rows(media / "ok.parquet", rows[:1])
    assert len(load_ds(verl, tiny_processor)) == 1  # good frame lists still load


# ----------------------------------------------------------------------------- 3. symlink loops and NUL bytes


def test_symlink_loops_and_nul_bytes_are_counted_rejects_in_preprocessing(media: Path, tmp_path: Path) -> None:
    """They stopped preprocessing with a RuntimeError (a loop) or a ValueError (NUL); now a reject like the others."""
    (media / "loopy").mkdir()
    Image.new("RGB", (56, 56), "red").save(media / "loopy" / "f1.png")
    (media / "loopy" / "f2.png").symlink_to("f2.png")
    (media / "loop.mp4").symlink_to("loop.mp4")
    rows = [
        ({"question": "<image>Q?", "images": ["loop.png"]}, "unreadable_image"),
        ({"question": "<image>Q?", "images": ["bad\x00.png"]}, "unreadable_image"),
        ({"question": "<image>Q?", "images": ["still.png"]}, None),
        ({"question": "<video>Q?", "videos": ["loop.mp4"]}, "unreadable_video"),
        ({"question": "<video>Q?", "videos": ["clip\x00.mp4"]}, "unreadable_video"),
        ({"question": "<video>Q?", "videos": ["loopy"]}, "unreadable_video"),  # a frame folder with a looping frame
        ({"question": "<video>Q?", "videos": ["clip.mp4"]}, None),
    ]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({**r, "answer": "a"}) + "\n" for r, _ in rows))
    out = tmp_path / "out"
    report = jsonl.main(
        [
            "--input",
            str(src),
            "--image-dir",
            str(media),
            "--output-dir",
            str(out),
            "--no-progress",
            "--video-min-pixels",
            "3136",
            "--video-max-pixels",
            "12544",
        ]
    )
    assert report["splits"]["train"]["written"] == 2
    got = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    want = [(f"{src}:{k + 1}", reason) for k, (_, reason) in enumerate(rows) if reason]
    assert [(r["source"], r["reason"]) for r in got] == want, got
    details = [r["detail"] for r in got]
    assert "Symlink loop" in details[0] or "symbolic links" in details[0]
    assert "NUL byte" in details[1] and "NUL byte" in details[3] and "f2.png" in details[4]


def test_symlink_loops_and_nul_bytes_are_data_errors_naming_file_and_row(media: Path, tiny_processor: Any) -> None:
    """Training raised a bare RuntimeError for a loop and counted a NUL video path as an unresizable image; both are
    now the DataError a missing file gets, naming file, row and what is wrong with the path."""
    (media / "loop.mp4").symlink_to("loop.mp4")
    cases = [
        ({"q": "<image>Q?", "images": [{"bytes": None, "path": "loop.png"}]}, "image 0: image path 'loop.png' cannot"),
        ({"q": "<image>Q?", "images": [{"bytes": None, "path": "a\x00.png"}]}, "image 0: .*contains a NUL byte"),
        ({"q": "<video>Q?", "videos": [{"video": "loop.mp4"}]}, "video 0: video path 'loop.mp4' cannot be resolved"),
        ({"q": "<video>Q?", "videos": [{"video": "a\x00.mp4"}]}, "video 0: .*contains a NUL byte"),
        ({"q": "<video>Q?", "videos": [{"video": ["f0.png", "loop.png"]}]}, "video 0: frame 1: .*cannot be resolved"),
        ({"q": "<video>Q?", "videos": [{"video": ["f0.png", "a\x00.png"]}]}, "video 0: frame 1: .*NUL byte"),
    ]
    for k, (row, msg) in enumerate(cases):
        path = write_rows(media / f"bad{k}.parquet", [{"q": "Plain text?"}, row])
        with pytest.raises(DataError, match=f"{path} row 1: {msg}"):
            ds = load_ds(path, tiny_processor)
            pytest.fail(f"case {k} loaded: {ds.report['filtered_by_reason']}")


# -------------------------------------------------------------------------------------- 4. EasyR1's video rows


def test_easyr1_video_rows_load_like_verl_entries(media: Path, tiny_processor: Any) -> None:
    """EasyR1 writes a video as a bare list of frame paths or a path string; they load as verl's ``{"video": ...}``
    equivalents, confined to the data folder the same way."""
    frames = ["f0.png", "f1.png", "f2.png"]
    one, two = "<video>Q?", "<video><video>Q?"
    easy_rows = [{"q": one, "videos": [frames]}, {"q": two, "videos": [frames, frames[:2]]}]
    verl_rows = [
        {"q": one, "videos": [{"video": frames}]},
        {"q": two, "videos": [{"video": frames}, {"video": frames[:2]}]},
    ]
    easy = write_rows(media / "easy.parquet", easy_rows)
    verl = write_rows(media / "verl.parquet", verl_rows)
    a, b = load_ds(easy, tiny_processor), load_ds(verl, tiny_processor)
    assert len(a) == len(b) == 2 and list(a.prompt_lengths) == list(b.prompt_lengths)
    for i in range(2):
        pa_, pb = a[i], b[i]
        assert pa_.prompt_ids == pb.prompt_ids and len(pa_.videos) == len(pb.videos) == i + 1
        for va, vb in zip(pa_.videos, pb.videos):
            assert va.timestamps == vb.timestamps and va.sample_fps == vb.sample_fps
            assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(va.frames, vb.frames))
    files = write_rows(media / "easy_files.parquet", [{"q": "<video>Q?", "videos": ["clip.mp4"]}])
    verl_files = write_rows(media / "verl_files.parquet", [{"q": "<video>Q?", "videos": [{"video": "clip.mp4"}]}])
    va, vb = load_ds(files, tiny_processor)[0].videos[0], load_ds(verl_files, tiny_processor)[0].videos[0]
    assert va.timestamps == vb.timestamps and len(va.frames) == len(vb.frames) == 6
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(va.frames, vb.frames))
    for k, videos in enumerate([[["f0.png", "../outside.png"]], ["../outside.mp4"]]):
        path = write_rows(media / f"easy_out{k}.parquet", [{"q": "<video>Q?", "videos": videos}])
        with pytest.raises(DataError, match=f"{path} row 0: video 0: .*leaves the data folder"):
            load_ds(path, tiny_processor)


# ----------------------------------------------------------------------------- 5. the dry run's media columns


def test_the_dry_run_describes_video_image_and_text_only_columns(
    media: Path, tmp_path: Path, tiny_model_dir: str, capsys: Any
) -> None:
    """A video dataset was described as "no column 'images' (data.image_key): text-only prompts"."""
    rows = [
        {"q": "<video>Q?", "videos": [{"video": ["f0.png", "f1.png"]}]},
        {"q": "<video><video>Q?", "videos": [{"video": ["f2.png"] * 2}] * 2},
    ]
    videos = write_rows(media / "videos.parquet", rows)
    assert dry_run.run(cfg_of(tiny_model_dir, videos, tmp_path), [], []) == dry_run.EXIT_OK
    out = capsys.readouterr().out
    assert f"{videos}: videos column 'videos' (data.video_key): 3 video(s); no image column" in out, out
    assert "text-only" not in out and "max videos/prompt 2" in out
    still = {"bytes": None, "path": "still.png"}
    row = {"q": "<image><video>Q?", "images": [still], "videos": ["clip.mp4"]}
    both = write_rows(media / "both.parquet", [row] * 2)
    assert dry_run.run(cfg_of(tiny_model_dir, both, tmp_path), [], []) == dry_run.EXIT_OK  # 2 prompts: a batch
    out = capsys.readouterr().out
    assert "videos column 'videos' (data.video_key): 2 video(s); images column 'images' (data.image_key)" in out
    assert "text-only" not in out
    text = write_rows(media / "text.parquet", [{"q": "What is red?"}] * 2)
    assert dry_run.run(cfg_of(tiny_model_dir, text, tmp_path), [], []) == dry_run.EXIT_OK
    out = capsys.readouterr().out
    assert "no column 'images' (data.image_key) nor 'videos' (data.video_key): text-only prompts" in out


def test_recorded_frames_in_any_order_decode_as_before(media: Path) -> None:
    """Recorded ``frames_indices`` out of order and repeated: the frames that arrive before the first one's size is
    known wait for it, then all are resized alike; ``keep=False`` only checks."""
    from vlmrl.data.video import decode_frames

    idx = [9, 2, 9, 20, 0, 5]
    stamps = [i / 10 for i in idx]
    rules = VideoRules(28, 3136, 12544, None, qwen_vl.FrameSampling())
    entry = {"video": "clip.mp4", "frames_indices": idx, "timestamps": stamps, "total_num_frames": 30}
    video = build_video(parse_entry(entry), media, rules)
    size = qwen_vl.video_frame_size(112, 84, len(idx), 28, 3136, 12544, None)
    want = reference_frames(media / "clip.mp4", idx, size)
    assert [f.size for f in video.frames] == [size] * 6 and video.timestamps == stamps
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(video.frames, want))
    assert decode_frames(media / "clip.mp4", idx, keep=False) == []
    full = decode_frames(media / "clip.mp4", idx)
    assert [f.size for f in full] == [(112, 84)] * 6  # no size: the source's, as before
