"""Small builders shared by tests (not fixtures: plain functions)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from vlmrl.batch import PromptSample, Video
from vlmrl.models import qwen_vl
from vlmrl.models.families import family_of_processor
from vlmrl.rollout.base import TurnOutput


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> Image.Image:
    """A plain RGB image."""
    return Image.new("RGB", size, colour)


def noise(seed: int, size: tuple[int, int] = (84, 56)) -> Image.Image:
    """A random RGB image (its features differ from any other seed's)."""
    import numpy as np

    arr = np.random.RandomState(seed).randint(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(arr)


def dataset_image(processor, image: Image.Image) -> Image.Image:
    """An image as the dataset hands it on: resized to the pixel bounds (a tiled family's: as it is)."""
    if family_of_processor(processor).tiles:
        return image
    ip = processor.image_processor
    return qwen_vl.resize_image(image, qwen_vl.patch_factor(ip), *qwen_vl.pixel_bounds(ip))


def make_prompt(processor, text: str, images: list[Image.Image], index: int = 0, answer: str = "") -> PromptSample:
    """A PromptSample the way the dataset builds one: chat with image parts, resized images, one pad per image."""
    resized = [dataset_image(processor, im) for im in images]
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = qwen_vl.engine_prompt_ids(processor.tokenizer, prompt_text, len(images))
    return PromptSample(
        index=index,
        uid=f"test:{index}",
        data_source="test",
        messages=messages,
        prompt_text=prompt_text,
        prompt_ids=ids,
        images=resized,
        original_sizes=[im.size for im in images],
        ground_truth=answer,
        extra_info={},
    )


VERL_EXAMPLES = Path(__file__).resolve().parent / "verl_examples"
"""verl's own launch scripts and preprocessing, byte for byte (see its README)."""


def verl_script_overrides(script: str, home: Path, *args: str) -> list[str]:
    """The arguments verl's ``tests/verl_examples/<script>`` passes to its trainer, as the shell expands them with
    ``HOME=home`` (``vlmrl.config.verl.scripts.commands`` records them; nothing trains)."""
    import os

    from vlmrl.config.verl.scripts import commands

    rec = commands(VERL_EXAMPLES / script, list(args), env={**os.environ, "HOME": str(home)})
    assert rec.returncode == 0 and len(rec.commands) == 1, rec.stderr[-2000:]
    return rec.commands[0].argv


def build_verl_home(home: Path) -> Path:
    """A HOME whose ~/data/geo3k and ~/data/geo3k_multiturn_w_tool hold verl's own preprocessing output (its geo3k.py
    and geo3k_multiturn_w_tool.py) of a Geometry3K stand-in (1200 train rows: the scripts' batches of 512 and 1152
    prompts fit). verl's scripts import ``verl.utils.hdfs_io`` only to copy to HDFS (not asked for here); the verl
    package itself needs its whole dependency set to import, so that one module is stubbed and the scripts' own code
    runs as it is."""
    import os
    import subprocess
    import sys

    from vlmrl.testing.smoke import geo3k_source

    src = geo3k_source(home / "geometry3k", train=1200, test=20)
    runner = (
        "import runpy, sys, types\n"
        "hdfs = types.ModuleType('verl.utils.hdfs_io'); hdfs.copy = hdfs.makedirs = lambda *a, **k: None\n"
        "sys.modules.update({'verl': types.ModuleType('verl'), 'verl.utils': types.ModuleType('verl.utils'),\n"
        "                    'verl.utils.hdfs_io': hdfs})\n"
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    for script, folder in (("geo3k.py", "geo3k"), ("geo3k_multiturn_w_tool.py", "geo3k_multiturn_w_tool")):
        subprocess.run(
            [
                sys.executable,
                "-c",
                runner,
                str(VERL_EXAMPLES / script),
                "--local_dataset_path",
                str(src),
                "--local_save_dir",
                str(home / "data" / folder),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "HOME": str(home)},
            timeout=300,
        )
        assert all((home / "data" / folder / f"{split}.parquet").is_file() for split in ("train", "test"))
    return home


def cached_verl_home() -> Path:
    """:func:`build_verl_home`, built once per version of the code that writes it (in $VLMRL_CACHE, atomically, so
    parallel test processes share it; tests/prepare.py builds it before the suite runs)."""
    import hashlib
    import inspect

    from vlmrl.testing.tiny import cache_root, cached_build

    code = [
        VERL_EXAMPLES / "geo3k.py",
        VERL_EXAMPLES / "geo3k_multiturn_w_tool.py",
        Path(__file__).parents[1] / "vlmrl" / "testing" / "smoke.py",
    ]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in code) + inspect.getsource(build_verl_home).encode())
    return cached_build(
        cache_root() / f"verl-home-{key.hexdigest()[:12]}", "data/geo3k_multiturn_w_tool/test.parquet", build_verl_home
    )


def verl_geo3k_launch_line(home: Path) -> list[str]:
    """verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh as the shell runs it (ENGINE=vllm, no extra arguments)."""
    return verl_script_overrides("run_qwen2_5_vl-7b.sh", home)


# ------------------------------------------------------------------------------------------------------ videos


def video_prompt(processor, text: str, videos: list[list[Image.Image]], fps: float, images=(), index: int = 0):
    """A PromptSample the way the dataset builds one: frames resized with the video rules (odd counts padded),
    images with the image rules, one pad per image and per video."""
    vp = processor.video_processor if videos else None  # (Idefics3's processor has none)
    vids = []
    for frames in videos:
        size = qwen_vl.video_frame_size(
            *frames[0].size, len(frames), qwen_vl.patch_factor(vp), *qwen_vl.pixel_bounds(vp), None
        )
        resized = qwen_vl.resize_frames(frames, size)
        stamps = [k / fps for k in range(len(frames))]
        vids.append(Video(resized, stamps + stamps[-1:] * (len(resized) - len(frames)), fps, frames[0].size))
    ims = [dataset_image(processor, im) for im in images]
    content = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos]
    messages = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
    prompt_text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = qwen_vl.engine_prompt_ids(processor.tokenizer, prompt_text, len(images), len(videos))
    return PromptSample(
        index,
        f"test:{index}",
        "test",
        messages,
        prompt_text,
        ids,
        ims,
        [im.size for im in images],
        "red",
        {},
        videos=vids,
    )


def expanded(processor, p: PromptSample) -> list[int]:
    """A prompt's ids with its image and video pads expanded as the processor does (what an engine returns)."""
    from vlmrl.models.inputs import expand_pads, process_images

    (v,) = process_images(processor, [p])
    return expand_pads(list(p.prompt_ids), v, processor, family_of_processor(processor))


def clip(n: int, size=(84, 56), seed: int = 10) -> list[Image.Image]:
    """``n`` random frames (a clip no two of whose frames look alike)."""
    return [noise(seed + k, size) for k in range(n)]


def write_mp4(path: Path, frames: int = 30, size=(112, 84), rate: int = 10) -> Path:
    """A small MPEG-4 video of a red bar moving right."""
    import av
    import numpy as np

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


class ScriptedEngine:
    """Answers turn k of every trajectory with ``script[k]`` (text + <|im_end|>), recording each request."""

    def __init__(self, tokenizer, script: list[str], as_text: bool = False) -> None:
        """``as_text``: the script's special-token strings (``<|image_pad|>``) become their characters' tokens, as
        a policy that writes them piece by piece produces them."""
        self.tok, self.script, self.requests, self.as_text = tokenizer, script, [], as_text
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate_turns(self, requests, spec):
        self.requests.append(requests)
        turn = len(self.requests) - 1
        out = []
        for r in requests:
            text = self.script[min(turn, len(self.script) - 1)]
            ids = self.tok(text, add_special_tokens=False, split_special_tokens=self.as_text)["input_ids"]
            ids = ids[: r.max_tokens]
            full = len(ids) == r.max_tokens
            ids = ids if full else ids + [self.end]
            out.append(TurnOutput(ids, [-0.5] * len(ids), "length" if full else "stop"))
        return out


def make_agent(processor, engine, runner, budget: int = 400, max_images: int = 4, **mt):
    """A MultiTurnAgent on ``engine`` with ``runner``'s tools, the tiny processor's image bounds and ``mt`` settings."""
    from vlmrl.config.schema import MultiTurnConfig
    from vlmrl.rollout.multi_turn import MultiTurnAgent

    cfg = MultiTurnConfig(enable=True, tool_config_path="unused.yaml", tool_timeout_s=runner.timeout_s, **mt)
    factor = qwen_vl.patch_factor(processor.image_processor)
    bounds = (factor, *qwen_vl.pixel_bounds(processor.image_processor))
    return MultiTurnAgent(engine, runner, cfg, processor.tokenizer, bounds, budget, max_images=max_images)


def synthetic_data(out: Path, families: str = "colour", train: int = 16, test: int = 4, size: int = 56) -> Path:
    """``preprocess/synthetic.py`` data in ``out`` (seed 0, no progress bar); returns ``out``."""
    from vlmrl.preprocess.synthetic import main as synthetic

    synthetic(
        [
            "--output-dir",
            str(out),
            "--families",
            families,
            "--image-size",
            str(size),
            "--train-size",
            str(train),
            "--test-size",
            str(test),
            "--seed",
            "0",
            "--no-progress",
        ]
    )
    return out


def inline_cfg(model: str, data: Path, out: Path, *extra: str):
    """A few-second in-process run on ``data``/train.parquet: one worker in this process, the transformers rollout,
    4 prompts x 2 samples of 4 tokens, metrics to jsonl only, no validation (``extra`` overrides come last)."""
    from vlmrl.config import load

    return load(
        [
            f"data.train_files={data / 'train.parquet'}",
            "data.val_files=null",
            f"actor_rollout_ref.model.path={model}",
            f"trainer.default_local_dir={out}",
            "trainer.launcher=inline",
            "actor_rollout_ref.rollout.name=hf",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=4",
            "trainer.logger=[jsonl]",
            "trainer.val_before_train=false",
            *extra,
        ],
        config_name="tiny_cpu",
    )
