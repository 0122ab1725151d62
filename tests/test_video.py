"""Video inputs end to end: preprocessing (the synthetic video families, JSONL with a video file and a frame folder,
every video reject reason), the dataset (verl-style entries, bad ones named), frame sampling and M-RoPE positions as
qwen-vl-utils and vLLM compute them, engine-vs-trainer log-probs with vLLM and HF on video and image+video prompts,
the dummy vision pass on ranks without videos, what rewards see, and a tiny training run that learns from video."""

from __future__ import annotations

import datetime
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText
from utils import noise
from vlmrl.preprocess import common, jsonl

from vlmrl.batch import PromptSample, RewardSample, RolloutBatch, Video
from vlmrl.config import ActorRolloutRefConfig, DataConfig, RolloutConfig
from vlmrl.data import DataError, RLDataset
from vlmrl.models import forward, qwen_vl
from vlmrl.models.inputs import build_inputs, process_images
from vlmrl.rollout.base import SamplingSpec
from vlmrl.rollout.hf import HFRollout

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------------ helpers


def video_prompt(processor, text: str, videos: list[list[Image.Image]], fps: float, images=(), index: int = 0):
    """A PromptSample the way the dataset builds one: frames resized with the video rules (odd counts padded),
    images with the image rules, one pad per image and per video."""
    vp, ip = processor.video_processor, processor.image_processor
    vids = []
    for frames in videos:
        size = qwen_vl.video_frame_size(*frames[0].size, len(frames), qwen_vl.patch_factor(vp),
                                        *qwen_vl.pixel_bounds(vp), None)  # fmt: skip
        resized = qwen_vl.resize_frames(frames, size)
        stamps = [k / fps for k in range(len(frames))]
        vids.append(Video(resized, stamps + stamps[-1:] * (len(resized) - len(frames)), fps, frames[0].size))
    ims = [qwen_vl.resize_image(im, qwen_vl.patch_factor(ip), *qwen_vl.pixel_bounds(ip)) for im in images]
    content = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = qwen_vl.engine_prompt_ids(processor.tokenizer, prompt_text, len(images), len(videos))
    return PromptSample(index, f"test:{index}", "test", messages, prompt_text, ids, ims, [im.size for im in images],
                        "red", {}, videos=vids)  # fmt: skip


def expanded(processor, p: PromptSample) -> list[int]:
    """A prompt's ids with its image and video pads expanded as the processor does (what an engine returns)."""
    (v,) = process_images(processor, [p])
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    merge = processor.image_processor.merge_size
    out = qwen_vl.expand_image_pads(p.prompt_ids, ids.image_pad, qwen_vl.tokens_per_image(v.image_grid_thw, merge)
                                    if v.num_images else [])  # fmt: skip
    return qwen_vl.expand_image_pads(out, ids.video_pad, qwen_vl.tokens_per_image(v.video_grid_thw, merge)
                                     if v.num_videos else [])  # fmt: skip


def clip(n: int, size=(84, 56), seed: int = 10) -> list[Image.Image]:
    return [noise(seed + k, size) for k in range(n)]


def write_mp4(path: Path, frames: int = 30, size=(112, 84), rate: int = 10) -> Path:
    """A small MPEG-4 video of a red bar moving right."""
    import av

    w, h = size
    with av.open(str(path), "w") as out:
        s = out.add_stream("mpeg4", rate=rate)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(frames):
            a = np.full((h, w, 3), 255, np.uint8)
            a[20:40, 3 * i : 3 * i + 20] = (255, 0, 0)
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return path


def load(files, processor, **kw) -> RLDataset:
    return RLDataset(files, processor, DataConfig(train_files=files, max_prompt_length=256, **kw), verbose=False)


def lp_gap(model, processor, prompts, rb, fn=forward.shared_sample_logits) -> float:
    ids = qwen_vl.vision_token_ids(processor.tokenizer)
    x = build_inputs(prompts, rb, process_images(processor, prompts), processor.tokenizer.pad_token_id)
    with torch.no_grad():
        logits, extra = fn(model, x, ids)
        lp = forward.token_logprobs(logits, x.responses)
    assert float(extra) == 0.0
    return max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs) if r)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


# ----------------------------------------------------------------------------------- sampling and positions


def test_frame_sampling_and_frame_size_follow_qwen_vl_utils():
    from qwen_vl_utils import vision_process as qvu

    for total, fps_src, kw in [(30, 10.0, {}), (7, 2.0, {}), (300, 30.0, {"fps": 1.0}), (9, 3.0, {"nframes": 4}),
                               (1000, 25.0, {"fps": 4.0, "max_frames": 16}), (5, 1.0, {"min_frames": 6})]:  # fmt: skip
        ele = dict(kw)
        want_n = qvu.smart_nframes(ele, total_frames=total, video_fps=fps_src)
        sampling = qwen_vl.FrameSampling(**{k: v for k, v in kw.items()})
        idx = qwen_vl.sample_frame_indices(total, fps_src, sampling)
        assert len(idx) == want_n and idx == torch.linspace(0, total - 1, want_n).round().long().tolist()
    with pytest.raises(ValueError, match="at least 2"):
        qwen_vl.sample_frame_indices(1, 2.0, qwen_vl.FrameSampling())
    # the per-frame pixel cap: qwen-vl-utils' max(min(max_pixels, total / n * 2), 1.05 * min_pixels)
    f = 28
    for n, w, h, total in [(4, 640, 360, None), (64, 1280, 720, 20_000_000), (768, 320, 240, None)]:
        lo, hi = qvu.VIDEO_MIN_TOKEN_NUM * f * f, qvu.VIDEO_MAX_TOKEN_NUM * f * f
        t = total if total is not None else qvu.MODEL_SEQ_LEN * f * f * 0.9
        cap = max(min(hi, t / n * qvu.FRAME_FACTOR), int(lo * 1.05))
        want_h, want_w = qvu.smart_resize(h, w, factor=f, min_pixels=lo, max_pixels=cap)
        assert qwen_vl.video_frame_size(w, h, n, f, lo, hi, total) == (want_w, want_h)
        tokens = (n // 2) * (want_w // f) * (want_h // f)
        assert qwen_vl.num_video_tokens(n, w, h, f, lo, hi, total) == tokens
    assert [im.size for im in qwen_vl.resize_frames(clip(3), (56, 28))] == [(56, 28)] * 4  # padded to pairs


def test_rope_index_is_transformers_for_images_and_vllm_for_videos(tiny_processor, hf_model):
    """qwen_vl.rope_index equals transformers' own positions on image prompts (left padding, two images), and on a
    video prompt starts the text after the video one past the video's largest position (temporal included), where
    transformers 5 starts it after the spatial extent only."""
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    prompts = [
        video_prompt(tiny_processor, "Two pictures.", [], 2.0, images=[noise(1), noise(2, (56, 112))]),
        video_prompt(tiny_processor, "One.", [], 2.0, images=[noise(3)]),
    ]
    rb = RolloutBatch([expanded(tiny_processor, p) for p in prompts], [[5, 6], [7]], [[0.0] * 2, [0.0]], ["stop"] * 2,
                      n=1)  # fmt: skip
    x = build_inputs(prompts, rb, process_images(tiny_processor, prompts), tiny_processor.tokenizer.pad_token_id)
    grid = torch.cat([im.image_grid_thw for im in x.images])
    mine = qwen_vl.rope_index(x.input_ids, x.attention_mask, ids, hf_model.config, grid)
    theirs = hf_model.model.get_rope_index(x.input_ids, qwen_vl.mm_token_type_ids(x.input_ids, ids), grid,
                                           attention_mask=x.attention_mask)[0]  # fmt: skip
    assert torch.equal(mine, theirs)

    p = video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5)  # 3 temporal patches, 2 s each
    rb = RolloutBatch([expanded(tiny_processor, p)], [[5, 6]], [[0.0, 0.0]], ["stop"], n=1)
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    v = x.images[0]
    pos = qwen_vl.rope_index(x.input_ids, x.attention_mask, ids, hf_model.config, None, v.video_grid_thw,
                             v.second_per_grid_ts)  # fmt: skip
    pads = (x.input_ids[0] == ids.video_pad).nonzero().flatten()
    start, end = int(pads[0]), int(pads[-1])
    t_axis = pos[0, 0, start : end + 1].unique().tolist()
    s0 = int(pos[0, 0, start])
    assert [t - s0 for t in t_axis] == [0, 2, 5]  # trunc(k x 2 tokens/s x 1.333 s)
    assert int(pos[0, 0, end + 1]) == int(pos[:, 0, : end + 1].max()) + 1 == s0 + 6
    theirs = hf_model.model.get_rope_index(x.input_ids, qwen_vl.mm_token_type_ids(x.input_ids, ids),
                                           video_grid_thw=v.video_grid_thw, second_per_grid_ts=v.second_per_grid_ts,
                                           attention_mask=x.attention_mask)[0]  # fmt: skip
    assert int(theirs[0, 0, end + 1]) < int(pos[0, 0, end + 1])  # why vlmrl builds its own


# ----------------------------------------------------------------------------------------------- preprocessing


def test_synthetic_video_families_write_verl_schema_parquet(tmp_path, tiny_processor):
    out = tmp_path / "synth"
    subprocess.run(
        [sys.executable, str(ROOT / "preprocess" / "synthetic.py"), "--output-dir", str(out), "--families",
         "video_colour,video_motion,video_order,colour", "--train-size", "24", "--test-size", "8",
         "--image-size", "112", "--video-frames", "4", "--video-fps", "2", "--no-progress", "--num-proc", "2"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    table = pq.read_table(out / "train.parquet")
    assert table.column_names[:4] == ["data_source", "prompt", "images", "videos"]
    recs = table.to_pylist()
    by_family: dict[str, list] = {}
    for r in recs:
        by_family.setdefault(r["data_source"].split("/")[1], []).append(r)
    assert sorted(by_family) == ["colour", "video_colour", "video_motion", "video_order"]
    for fam in ("video_colour", "video_motion", "video_order"):
        for r in by_family[fam]:
            (video,) = r["videos"]
            assert r["prompt"][0]["content"].count("<video>") == 1 and r["images"] == []
            assert len(video["frames"]) == 4 and video["timestamps"] == [0.0, 0.5, 1.0, 1.5]
            assert video["sample_fps"] == 2.0 and video["frames_indices"] == [0, 1, 2, 3]
            assert r["reward_model"]["ground_truth"] in r["extra_info"]["choices"]
    assert {r["reward_model"]["ground_truth"] for r in by_family["video_motion"]} == {"left", "right", "up", "down"}
    # the motion family: the square moves by one step per frame, the way the answer says (the canvas wraps)
    for r in by_family["video_motion"]:
        frames = [np.asarray(Image.open(io.BytesIO(f["bytes"]))) for f in r["videos"][0]["frames"]]
        axis = 1 if r["reward_model"]["ground_truth"] in ("left", "right") else 0
        coloured = [np.flatnonzero((fr != 255).any(axis=2).any(axis=1 - axis)) for fr in frames]
        assert all(len(c) for c in coloured)
        sign = 1 if r["reward_model"]["ground_truth"] in ("right", "down") else -1
        first = [int(c[0]) if not (c[0] == 0 and c[-1] == 111) else int(c[np.argmax(np.diff(c) > 1) + 1])
                 for c in coloured]  # fmt: skip
        assert all((b - a) * sign % 112 == 14 for a, b in zip(first, first[1:])), first
    # the order family: two colours, the answer the second one
    for r in by_family["video_order"]:
        frames = [np.asarray(Image.open(io.BytesIO(f["bytes"]))) for f in r["videos"][0]["frames"]]
        centre = [tuple(fr[fr.shape[0] // 2, fr.shape[1] // 2]) for fr in frames]
        assert centre[0] == centre[1] != centre[2] == centre[3]
    import datasets  # verl's readers: frames load as images

    d = datasets.load_dataset("parquet", data_files=str(out / "train.parquet"), split="train")
    assert isinstance(d[0]["videos"][0]["frames"][0], Image.Image)
    ds = load(str(out / "train.parquet"), tiny_processor)
    assert len(ds) == 24 and ds.max_videos_per_prompt == 1 and ds.max_images_per_prompt == 1
    vpad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).video_pad
    for i in range(len(ds)):
        p = ds[i]
        assert p.prompt_ids.count(vpad) == len(p.videos)
        if p.videos:
            assert [f.size for f in p.videos[0].frames] == [(112, 112)] * 4
            assert ds.prompt_lengths[i] == len(p.prompt_ids) - 1 + 2 * 16  # 2 frame pairs x 4x4 merged patches


@pytest.fixture()
def media(tmp_path) -> Path:
    m = tmp_path / "media"
    (m / "frames").mkdir(parents=True)
    write_mp4(m / "clip.mp4")
    for k in range(7):
        Image.new("RGB", (56, 56), (0, 0, 30 * k)).save(m / "frames" / f"f{k + 1}.png")  # f1 .. f7, f10 sorts last
    Image.new("RGB", (56, 56), (200, 0, 0)).save(m / "frames" / "f10.png")
    Image.new("RGB", (40, 30), "red").save(m / "still.png")
    return m


def test_jsonl_with_a_video_file_and_a_frame_folder(tmp_path, media, tiny_processor):
    recs = [
        {"question": "<video>Which way does it move?", "answer": "right", "videos": ["clip.mp4"]},
        {"question": "<image><video>Same colour?", "answer": "no", "images": ["still.png"], "videos": "frames"},
    ]
    src = tmp_path / "clips.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    args = ["--input", str(src), "--image-dir", str(media), "--no-progress", "--video-fps", "2",
            "--video-min-pixels", "3136", "--video-max-pixels", "12544"]  # fmt: skip
    jsonl.main([*args, "--output-dir", str(tmp_path / "bytes")])
    jsonl.main([*args, "--output-dir", str(tmp_path / "paths"), "--store-paths"])
    first, second = pq.read_table(tmp_path / "bytes" / "train.parquet").to_pylist()
    (v,) = first["videos"]  # 30 frames at 10 fps = 3 s -> 6 frames at 2 fps, evenly spaced
    assert v["video"] is None and len(v["frames"]) == 6 and v["total_num_frames"] == 30 and v["video_fps"] == 10.0
    assert v["frames_indices"] == [0, 6, 12, 17, 23, 29] and v["timestamps"] == [i / 10 for i in v["frames_indices"]]
    assert v["sample_fps"] == 2.0 and Image.open(io.BytesIO(v["frames"][0]["bytes"])).size == (112, 84)
    (f,) = second["videos"]  # 8 frames at --frames-fps 2, natural order (f10 last), sampled to 8
    assert f["total_num_frames"] == 8 and f["frames_indices"] == list(range(8)) and len(second["images"]) == 1
    assert f["frames"][-1]["path"] == "frames/f10.png" and f["frames"][1]["path"] == "frames/f2.png"
    assert f["frames"][0]["bytes"] == (media / "frames" / "f1.png").read_bytes()  # source bytes kept
    stored = pq.read_table(tmp_path / "paths" / "train.parquet").to_pylist()
    assert stored[0]["videos"][0]["video"].endswith(".mp4") and stored[0]["videos"][0]["frames"] == []
    assert all(fr["bytes"] is None for fr in stored[1]["videos"][0]["frames"])
    a, b = (load(str(tmp_path / d / "train.parquet"), tiny_processor) for d in ("bytes", "paths"))
    for i in range(2):
        pa_, pb = a[i], b[i]
        assert pa_.prompt_ids == pb.prompt_ids and a.prompt_lengths[i] == b.prompt_lengths[i]
        for va, vb in zip(pa_.videos, pb.videos):
            assert va.timestamps == vb.timestamps and va.sample_fps == vb.sample_fps
            assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(va.frames, vb.frames))
    assert [fr.size for fr in a[0].videos[0].frames] == [(112, 84)] * 6


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_jsonl_every_video_reject_reason(tmp_path, media, monkeypatch):
    (media / "empty").mkdir()
    (media / "one").mkdir()
    Image.new("RGB", (56, 56)).save(media / "one" / "f.png")
    (media / "garbage.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"junk" * 50)
    (media / "zero.mp4").write_bytes(b"")
    write_mp4(media / "short.mp4", frames=1)
    write_mp4(media / "wide.mp4", frames=4, size=(256, 128))  # over the lowered bomb guard below
    (media / "list.m3u8").write_text(f"#EXTM3U\n#EXTINF:1,\nfile://{media / 'clip.mp4'}\n#EXT-X-ENDLIST\n")
    Image.new("RGB", (56, 56), "red").save(media / "still.mp4", format="PNG")  # FFmpeg alone would open it (png_pipe)
    write_mp4(tmp_path / "outside.mp4")
    (media / "link.mp4").symlink_to(tmp_path / "outside.mp4")
    os.mkfifo(media / "fifo.mp4")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20_000)  # 256x128 frames = 32768 > 20000
    rows_ = [
        ("<video>Q?", ["nope.mp4"], "unreadable_video"),
        ("<video>Q?", ["fifo.mp4"], "unreadable_video"),
        ("<video>Q?", ["../outside.mp4"], "video_outside_dir"),
        ("<video>Q?", ["link.mp4"], "video_outside_dir"),
        ("<video>Q?", ["clip.mp4"], None),  # the good one
        ("<video>Q?", ["garbage.mp4"], "corrupt_video"),
        ("<video>Q?", ["list.m3u8"], "corrupt_video"),  # a playlist naming another file
        ("<video>Q?", ["still.mp4"], "corrupt_video"),  # an image: not a container format on the allowlist
        ("<video>Q?", ["zero.mp4"], "empty_video"),
        ("<video>Q?", ["empty"], "empty_video"),
        ("<video>Q?", ["short.mp4"], "video_too_short"),
        ("<video>Q?", ["one"], "video_too_short"),
        ("<video>Q?", ["wide.mp4"], "video_too_large"),
        ("<video><video>Q?", ["clip.mp4"], "video_count_mismatch"),
        ("<video>Q?", ["big.mp4"], "video_file_too_large"),
    ]
    write_mp4(media / "big.mp4", frames=60)
    limit = (media / "big.mp4").stat().st_size - 1
    assert (media / "clip.mp4").stat().st_size < limit
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(json.dumps({"question": q, "answer": "a", "videos": v}) for q, v, _ in rows_) + "\n")
    out = tmp_path / "out"
    report = jsonl.main(["--input", str(src), "--image-dir", str(media), "--output-dir", str(out), "--no-progress",
                         "--max-video-bytes", str(limit)])  # fmt: skip
    got = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    want = [(f"{src}:{k + 1}", reason) for k, (_, _, reason) in enumerate(rows_) if reason]
    assert [(r["source"], r["reason"]) for r in got] == want, got
    assert {r for _, r in want} == set(common.VIDEO_REJECT_REASONS)  # every video reason, each from its row
    assert report["splits"]["train"]["written"] == 1
    assert "outside" in got[2]["detail"] and "not a video in a container format" in got[6]["detail"]


def test_dataset_reads_verl_video_entries_and_names_bad_rows(tmp_path, media, tiny_processor):
    """verl's ``{"video": path, "fps": ...}`` entries (sampled when read) and frame lists load; a bad entry is a
    DataError naming file and row."""

    def write(name: str, videos: list, question: str = "<video>What moves?") -> str:
        rec = {"data_source": "mine", "prompt": [{"role": "user", "content": question}], "videos": videos,
               "reward_model": {"style": "rule", "ground_truth": "a"}}  # fmt: skip
        path = media / name
        pq.write_table(pa.Table.from_pylist([rec]), path)
        return str(path)

    ds = load(write("verl.parquet", [{"video": "clip.mp4", "fps": 1.0}]), tiny_processor)
    (v,) = ds[0].videos  # 3 s at 1 fps -> 3 -> min_frames 4
    assert len(v.frames) == 4 and v.timestamps == [0.0, 1.0, 1.9, 2.9] and v.sample_fps == pytest.approx(4 / 3)
    ds = load(write("list.parquet", [{"video": ["frames/f1.png", "frames/f2.png", "frames/f3.png"]}]), tiny_processor)
    (v,) = ds[0].videos  # a frame list: every frame, padded to pairs, qwen-vl-utils' 2 fps
    assert len(v.frames) == 4 and v.sample_fps == 2.0 and v.timestamps == [0.0, 0.5, 1.0, 1.0]
    cases = [
        ([{"video": "../outside.mp4"}], "<video>Q", "video 0: video path '../outside.mp4' leaves the data folder"),
        ([{"video": "clip.mp4"}], "<video><video>Q", "2 <video> placeholder\\(s\\) in the prompt but 1 video"),
        ([{"video": "clip.mp4", "video_start": 1.0}], "<video>Q", "video_start not supported"),
        ([{"video": "clip.mp4", "fps": -1}], "<video>Q", "fps=-1 is not a positive number"),
        ([{"frames": [{"bytes": b"nope", "path": None}]}], "<video>Q", "not an image Pillow can identify"),
    ]
    for k, (videos, q, msg) in enumerate(cases):
        path = write(f"bad{k}.parquet", videos, q)
        with pytest.raises(DataError, match=f"{path} row 0: .*{msg}"):
            ds = load(path, tiny_processor)
            ds[0]
    path = write("key.parquet", [{"video": "clip.mp4"}])
    with pytest.raises(DataError, match="row 0: 1 <video> placeholder.*the file has no column 'clips': data.video_key"):
        load(path, tiny_processor, video_key="clips")


# ------------------------------------------------------------------------------------------- rollout vs trainer


@pytest.mark.vllm
def test_vllm_video_and_image_video_logprobs_match_the_trainer(tiny_model_dir, tiny_processor, hf_model):
    from vlmrl.rollout.vllm import VLLMRollout

    vp, ip = tiny_processor.video_processor, tiny_processor.image_processor
    engine = VLLMRollout(tiny_model_dir, rollout_cfg=RolloutConfig(), max_model_len=512, limit_images=1,
                         limit_videos=1, pixel_bounds=qwen_vl.pixel_bounds(ip),
                         video_pixel_bounds=qwen_vl.pixel_bounds(vp))  # fmt: skip
    mm = engine.llm.llm_engine.vllm_config.model_config.multimodal_config
    assert mm.mm_processor_cache_gb == 0 and mm.get_limit_per_prompt("video") == 1
    prompts = [
        video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5, index=0),
        video_prompt(tiny_processor, "Picture and clip.", [clip(5, (56, 56), 30)], 3.0, images=[noise(3)], index=1),
    ]
    rb = engine.generate(prompts, SamplingSpec(n=4, max_tokens=12, temperature=1.0))
    assert len({tuple(r) for r in rb.response_ids}) > 2
    for k, p in enumerate(prompts):  # the engine expanded the single pads as the processor does
        enc = tiny_processor(
            text=[p.prompt_text], images=p.images or None, videos=[v.frames for v in p.videos],
            videos_kwargs={"video_metadata": [{k: x for k, x in qwen_vl.video_metadata(len(v.frames), v.sample_fps)
                                               .items() if k != "do_sample_frames"} for v in p.videos],
                           "do_sample_frames": False, "cap_pixels_per_frame": False}, return_tensors="pt",
        )  # fmt: skip
        assert rb.prompt_ids[4 * k] == enc["input_ids"][0].tolist()
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits):
        gap = lp_gap(hf_model, tiny_processor, prompts, rb, fn)
        print(f"{fn.__name__}: max |lp_vllm - lp_trainer| = {gap:.2e}")
        assert gap <= 1e-4
    # the same forward with transformers' own M-RoPE positions after the video disagrees: the check above can fail
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    x = build_inputs(prompts[:1], rb.select_groups([0]), process_images(tiny_processor, prompts[:1]),
                     tiny_processor.tokenizer.pad_token_id)  # fmt: skip
    v = x.images[0]
    with torch.no_grad():
        logits = hf_model(
            input_ids=x.input_ids, attention_mask=x.attention_mask,
            mm_token_type_ids=qwen_vl.mm_token_type_ids(x.input_ids, ids),
            pixel_values_videos=v.pixel_values_videos.repeat(4, 1), video_grid_thw=v.video_grid_thw.repeat(4, 1),
            second_per_grid_ts=v.second_per_grid_ts.repeat(4),
        ).logits  # fmt: skip
    R = x.responses.shape[1]
    lp = torch.log_softmax(logits[:, -R - 1 : -1].float(), -1).gather(-1, x.responses[..., None]).squeeze(-1)
    wrong = max(float((lp[i, : len(r)] - torch.tensor(r)).abs().max()) for i, r in enumerate(rb.logprobs[:4]))
    assert wrong > 1e-4, wrong


def test_hf_rollout_on_video_matches_the_trainer(tiny_processor, hf_model):
    torch.manual_seed(4)
    prompts = [
        video_prompt(tiny_processor, "What happens?", [clip(6)], fps=1.5, index=0),
        video_prompt(tiny_processor, "Picture and clip.", [clip(4, (56, 112), 20)], 3.0, images=[noise(3)], index=1),
        video_prompt(tiny_processor, "Text only: say hi.", [], 2.0, index=2),
    ]
    rb = HFRollout(hf_model, tiny_processor).generate(prompts, SamplingSpec(n=3, max_tokens=10))
    assert len(rb) == 9 and all(rb.response_ids)
    vpad = qwen_vl.vision_token_ids(tiny_processor.tokenizer).video_pad
    assert rb.prompt_ids[0].count(vpad) == 3 * 6 and rb.prompt_ids[3].count(vpad) == 2 * 8
    for fn in (forward.shared_sample_logits, forward.full_sequence_logits):
        assert lp_gap(hf_model, tiny_processor, prompts, rb, fn) <= 1e-5


# ------------------------------------------------------------------------------------- ranks without videos


def _update_rank(rank: int, world: int, rendezvous: str, model_dir: str, groups: list[int], out: dict) -> None:
    import torch.distributed as dist
    from transformers import AutoProcessor

    from vlmrl.workers.policy import PolicyWorker

    # a collective the other rank never joins fails in a minute instead of hanging the test
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    proc = AutoProcessor.from_pretrained(model_dir)
    every = [
        video_prompt(proc, "What happens?", [clip(6)], fps=1.5, index=0),  # the video group
        video_prompt(proc, "Text only, no video.", [], 2.0, index=1),  # the group without one
    ]
    prompts = [every[g] for g in groups]
    n = 4
    resp = [[10 + (3 * g + k) % 7, 20 + k, 30] for g in groups for k in range(n)]
    rb = RolloutBatch([expanded(proc, p) for p in prompts for _ in range(n)], resp, [[0.0] * 3] * len(resp),
                      ["length"] * len(resp), n=n)  # fmt: skip
    x = build_inputs(prompts, rb, process_images(proc, prompts), proc.tokenizer.pad_token_id)
    arr = ActorRolloutRefConfig()
    arr.model.path = model_dir
    arr.model.enable_gradient_checkpointing = False
    arr.actor.optim.lr = 1e-2
    torch.manual_seed(0)
    ids = qwen_vl.vision_token_ids(proc.tokenizer)
    worker = PolicyWorker(arr, device="cpu", total_steps=2, vision_ids=ids, seed=1, max_response_length=3)
    adv = torch.tensor([1.0, -0.5, 0.25, 0.8] * len(groups))
    before = worker.logprobs(x)
    metrics = worker.update(x, adv, len(resp))
    out[(world, rank)] = {
        "before": before, "after": worker.logprobs(x), "grad_norm": metrics["actor/grad_norm"],
        "pg_loss": metrics["actor/pg_loss"], "pushed": sorted(name for name, _ in worker.engine_weights()),
    }  # fmt: skip
    dist.destroy_process_group()


def test_ranks_without_videos_run_the_dummy_vision_pass_and_train_alike(tiny_model_dir, tmp_path):
    """Two FSDP ranks, one with the video group and one with a text-only group (no video: the dummy vision pass keeps
    its collectives in step, in the same order), update exactly as one rank holding both: same loss, gradient norm
    and log-probs after the update. Before the fix this hung: the text-only rank reduce-scattered the root's
    gradients after the tower's, the video rank before."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        runs = [(2, [[0], [1]]), (1, [[0, 1]])]
        for world, shards in runs:
            rdv = f"file://{tmp_path / f'rdv{world}'}"
            procs = [ctx.Process(target=_update_rank, args=(r, world, rdv, str(tiny_model_dir), shards[r], out))
                     for r in range(world)]  # fmt: skip
            for p in procs:
                p.start()
            for p in procs:
                p.join(240)
            assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        results = dict(out)
    one, r0, r1 = results[(1, 0)], results[(2, 0)], results[(2, 1)]
    assert one["grad_norm"] > 1e-3 and abs(r0["grad_norm"] - one["grad_norm"]) <= 1e-5 * one["grad_norm"]
    assert abs(one["pg_loss"]) > 1e-2  # the workers' mean is the run's metric: each rank's part x world, averaged
    assert r0["grad_norm"] == r1["grad_norm"] and abs((r0["pg_loss"] + r1["pg_loss"]) / 2 - one["pg_loss"]) <= 1e-6
    both = torch.cat([r0["after"], r1["after"]])
    moved = float((one["after"] - one["before"]).abs().max())
    gap = float((both - one["after"][:, : both.shape[1]]).abs().max())
    assert moved > 1e-2 and gap <= 1e-4, (moved, gap)
    assert any("visual" in k for k in one["pushed"])


def test_a_video_less_micro_batch_runs_the_dummy_pass_with_the_same_loss(tiny_processor, tiny_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = qwen_vl.vision_token_ids(tiny_processor.tokenizer)
    p = video_prompt(tiny_processor, "Text only.", [], 2.0)
    rb = RolloutBatch([expanded(tiny_processor, p)], [[10, 11, 12]], [[0.0] * 3], ["length"], n=1)
    x = build_inputs([p], rb, process_images(tiny_processor, [p]), tiny_processor.tokenizer.pad_token_id)
    lp, _, extra = forward.response_logprobs(model, x, ids)
    assert float(extra.detach()) == 0.0 and extra.requires_grad
    (-(lp.sum()) + extra).backward()
    grads = [q.grad for q in qwen_vl.vision_tower(model).parameters()]
    assert all(g is not None and float(g.abs().sum()) == 0.0 for g in grads)  # reached, and exactly zero


# ------------------------------------------------------------------------------------------------------ rewards


def test_rewards_receive_the_frames_and_timestamps_the_model_saw(tiny_processor, tmp_path):
    from vlmrl.config import RewardConfig
    from vlmrl.reward import RewardManager

    p = video_prompt(tiny_processor, "Which colour comes second?", [clip(5, (56, 56), 40)], fps=2.5)
    rb = RolloutBatch([p.prompt_ids] * 2, [[10], [11]], [[0.0], [0.0]], ["stop"] * 2, n=2)
    samples = RewardSample.of_rollout([p], rb, tiny_processor.tokenizer, 8)
    (v,) = samples[0].videos
    assert v.frames is p.videos[0].frames and len(v.frames) == 6 and v.frames[0].size == (56, 56)
    assert v.timestamps == [0.0, 0.4, 0.8, 1.2, 1.6, 1.6] and v.sample_fps == 2.5
    fn = tmp_path / "seen.py"
    fn.write_text(
        "def seen(sample):\n"
        "    v = sample.videos[0]\n"
        "    return {'score': float(len(v.frames)) + v.timestamps[-1], 'width': float(v.frames[0].width)}\n"
    )
    with RewardManager(RewardConfig(function=f"{fn}:seen", num_workers=1)) as rm:  # in a worker process
        out = rm.score(samples)
    assert out.scores == [pytest.approx(7.6)] * 2


# ----------------------------------------------------------------------------------------------------- config


def test_video_keys_are_config_keys_and_bad_values_are_refused():
    from vlmrl.config import ConfigError
    from vlmrl.config import load as load_config

    cfg = load_config(["data.train_files=x.parquet", "actor_rollout_ref.model.path=m", "data.video_key=clips",
                       "data.video_fps=1.0", "data.video_max_pixels=50176"])  # fmt: skip
    assert cfg.data.video_key == "clips" and cfg.data.video_fps == 1.0
    bad = ["data.video_fps=0", "data.video_max_frames=1", "data.video_min_pixels=99999", "data.video_max_pixels=3136"]
    with pytest.raises(ConfigError) as e:
        load_config(["data.train_files=x.parquet", "actor_rollout_ref.model.path=m", *bad])
    for text in ("data.video_fps=0", "data.video_max_frames=1", "data.video_min_pixels=99999 >"):
        assert text in str(e.value)


# ------------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_training_on_the_video_colour_family_learns_with_vllm(tiny_model_dir, tmp_path):
    from runs import base_args, metrics, run_to_end

    data = tmp_path / "data"
    subprocess.run(
        [sys.executable, str(ROOT / "preprocess" / "synthetic.py"), "--output-dir", str(data), "--families",
         "video_colour", "--image-size", "112", "--train-size", "1024", "--test-size", "48", "--seed", "0",
         "--no-progress"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    out = tmp_path / "run"
    run = run_to_end(base_args(tiny_model_dir, data, out, "trainer.total_training_steps=70", "trainer.test_freq=70"),
                     timeout=900)  # fmt: skip
    assert "videos/prompt 1" in run.output()
    rows = metrics(out)
    val = {r["step"]: r["val/reward/mean"] for r in rows if "val/reward/mean" in r}
    assert val[0] <= 0.2 and val[70] >= 0.9, val
    train = [r for r in rows if "reward/mean" in r and r.get("step", 0) > 0]
    assert np.mean([r["reward/mean"] for r in train[-5:]]) >= 0.8
    assert max(r["rollout/logprob_diff"] for r in train) < 1e-3  # the engine and the trainer agree after every push
