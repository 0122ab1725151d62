"""Each model family vlmrl trains, measured the same way: the engine against the trainer, and what it learns.

    python benchmarks/bench_families.py [--families qwen2_5_vl,qwen3_vl,qwen3_vl_moe,glm4v,internvl] [--steps 80]
        [--video-steps 70]

Per family (its tiny model: ``python -m vlmrl.testing.tiny --family NAME``):

- exactness: vLLM (CPU; Gemma 3: the HF rollout, as vLLM's CPU attention is refused for it) samples 3 responses to
  each of an image, a two-image, a video, an image + video and a
  text-only prompt (a family vlmrl trains without videos: images in the video prompts' places, as the tests do);
  the largest |engine - trainer| log-prob over the sampled tokens for the trainer's shared-prompt, full-sequence
  and packed forwards; then every weight is perturbed and pushed into the running engine, and the same gap measured
  on new samples (tests/test_families.py asserts <= 1e-4 for both);
- learning: the quick start's recipe (``configs/tiny_cpu.yaml``, vLLM rollout, Gemma 3 the HF rollout, 2 worker
  processes) on the colour task
  for ``--steps`` steps and on the video colour task for ``--video-steps`` (the families vlmrl trains on videos):
  greedy validation before, in the middle and at the end, the first step where the 5-step mean training reward
  reaches 0.9, and the median step time.

Writes ``benchmarks/results/families.json`` and the ``## Model families`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    PY,
    ROOT,
    bench_env,
    machine_line,
    median,
    moving_average_hit,
    publish,
    result_head,
    run_json_worker,
    synthetic_data,
    table,
    vlmrl_train,
)

SECTION = "Model families"
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "internvl", "smolvlm", "llava_onevision", "gemma3")


def exactness(family: str) -> dict[str, Any]:
    """The engine-vs-trainer gaps of a fresh engine and after pushes (run in its own process)."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_families import Tiny, prompts_of, trainer_gaps  # the tests' prompts and gap, measured the same way
    from transformers import AutoProcessor

    from vlmrl.models.families import FAMILIES as FAMS
    from vlmrl.rollout.base import SamplingSpec
    from vlmrl.rollout.hf import HFRollout
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model, param_counts
    from vlmrl.workers.weights import engine_weights

    path = str(ensure_tiny_model(0, FAMILY_SPECS[family]))
    proc = AutoProcessor.from_pretrained(path)
    tiny = Tiny(family, path, proc, FAMS[family])
    model = tiny.model().eval()
    hf = tiny.family.bidirectional_images  # Gemma 3: vLLM's CPU engine is refused, the HF rollout samples
    engine = HFRollout(model, proc) if hf else tiny.engine()  # the tests' engine
    try:
        prompts = prompts_of(proc)
        spec = SamplingSpec(n=3, max_tokens=10)
        torch.manual_seed(0)
        fresh = trainer_gaps(model, tiny, prompts, engine.generate(prompts, spec))
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for _, p in model.named_parameters():  # zero-initialised biases too (the tests' perturbation)
                spread = float(p.std()) if p.numel() > 1 else 0.0
                p.add_(torch.randn(p.shape, generator=g) * 0.5 * (spread or 0.1))
        engine.update_weights(engine_weights(model))
        pushed = trainer_gaps(model, tiny, prompts, engine.generate(prompts, spec))
    finally:
        if not hf:
            engine.close()
    return {
        "sampler": "hf" if hf else "vllm",
        "fresh_gap": fresh,
        "pushed_gap": pushed,
        "params": param_counts(FAMILY_SPECS[family]),
    }


def learn(family: str, data: Path, out: Path, steps: int, test_freq: int) -> dict[str, Any]:
    """A quick-start run on ``data``: validation by step, the 0.9 mark, the median step time."""
    from vlmrl.models.families import FAMILIES as FAMS
    from vlmrl.testing.tiny import FAMILY_SPECS, ensure_tiny_model

    model = ensure_tiny_model(0, FAMILY_SPECS[family])
    hf = ["actor_rollout_ref.rollout.name=hf"] if FAMS[family].bidirectional_images else []  # as the quick start
    run = vlmrl_train(
        out,
        data,
        model,
        steps,
        [f"data.val_files={data / 'test.parquet'}", f"trainer.test_freq={test_freq}", *hf],
        timeout_s=1800,
    )
    rows = run["rows"]
    val = {str(r["step"]): r["val/reward/mean"] for r in rows if "val/reward/mean" in r}
    train = [r for r in rows if r.get("step", 0) > 0 and "reward/mean" in r]
    hit = moving_average_hit([r["reward/mean"] for r in train], 5, 0.9)
    return {
        "val": val,
        "hit_0.9_step": int(train[hit - 1]["step"]) if hit else None,
        "step_s": median([r["timing/step_s"] for r in train[2:]]),
        "logprob_diff_max": max(r.get("rollout/logprob_diff", 0.0) for r in train),
        "wall_s": run["wall_s"],
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    c = res["config"]
    rows = []
    for name, f in res["families"].items():
        gaps = max(f["exactness"]["fresh_gap"].values()), max(f["exactness"]["pushed_gap"].values())
        img, vid = f["image"], f["video"] or NO_VIDEO
        rows.append(
            [
                name,
                f"{f['exactness']['params']['total'] / 1e6:.2f} M",
                f"{gaps[0]:.1e}",
                f"{gaps[1]:.1e}",
                " / ".join(f"{v:.2f}" for v in img["val"].values()),
                str(img["hit_0.9_step"] or "not reached"),
                f"{img['step_s']:.2f}",
                " / ".join(f"{v:.2f}" for v in vid["val"].values()) or "no videos",
                f"{vid['step_s']:.2f}" if vid["step_s"] else "",
            ]
        )
    return "\n".join(
        [
            f"`python benchmarks/bench_families.py` ({res['date']}). Each family's tiny model. Exactness: the largest "
            "|vLLM - trainer| log-prob over 3 samples of an image, two-image, video, image + video and text-only "
            "prompt (shared-prompt, full-sequence and packed forwards), on a fresh engine and after a push of "
            "perturbed weights (Gemma 3: the HF rollout's samples, vLLM's CPU attention being refused for it; its "
            "push is the policy's own weights). "
            f"Learning: the quick start's recipe on the colour task ({c['steps']} steps) and the video colour task "
            f"({c['video_steps']} steps), greedy validation at the steps shown.",
            "",
            table(
                [
                    "family",
                    "parameters",
                    "engine gap",
                    "gap after push",
                    f"colour val (steps {c['image_val_steps']})",
                    "5-step mean >= 0.9 at step",
                    "s/step",
                    f"video val (steps {c['video_val_steps']})",
                    "video s/step",
                ],
                rows,
            ),
            "",
            machine_line(res),
        ]
    )


README_LABELS = {
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_vl_moe": "Qwen3-VL-MoE",
    "glm4v": "GLM-4.1V",
    "internvl": "InternVL",
    "smolvlm": "SmolVLM",
    "llava_onevision": "LLaVA-OneVision",
    "gemma3": "Gemma 3 (HF rollout)",
}
NO_VIDEO = {"val": {}, "step_s": None}
"""A family vlmrl trains without videos (``Family.videos``): no video run."""


def readme_table(res: dict[str, Any]) -> str:
    """The README's model-families table (``--readme-table`` prints it; tests/test_readme_figures.py ties each
    figure of it to this file)."""
    c = res["config"]
    rows = []
    for name, f in res["families"].items():
        ex, img, vid = f["exactness"], f["image"], f["video"] or NO_VIDEO
        rows.append(
            [
                README_LABELS[name],
                f"{ex['params']['total'] / 1e6:.2f} M",
                f"{max(ex['fresh_gap'].values()) * 1e6:.1f}",
                f"{max(ex['pushed_gap'].values()) * 1e6:.1f}",
                " / ".join(f"{v:.2f}" for v in img["val"].values()),
                f"{img['step_s']:.2f} s",
                " / ".join(f"{v:.2f}" for v in vid["val"].values()) or "no videos",
                f"{vid['step_s']:.2f} s" if vid["step_s"] else "",
            ]
        )
    return table(
        [
            "tiny model",
            "parameters",
            "engine gap (1e-6)",
            "after a push (1e-6)",
            f"colour: validation at steps {c['image_val_steps']}",
            "s/step",
            f"video colour: validation at steps {c['video_val_steps']}",
            "s/step",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--video-steps", type=int, default=70)
    ap.add_argument("--readme-table", action="store_true", help="print the README's table from the results file")
    ap.add_argument("--exactness", help=argparse.SUPPRESS)  # worker mode: one family's exactness, JSON to --out
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.readme_table:
        print(readme_table(json.loads((ROOT / "benchmarks" / "results" / "families.json").read_text())))
        return 0
    if a.exactness:
        Path(a.out).write_text(json.dumps(exactness(a.exactness)))
        return 0
    work = Path(os.environ.get("VLMRL_BENCH_DIR", "/tmp/vlmrl-bench-families"))
    work.mkdir(parents=True, exist_ok=True)
    image = synthetic_data(work / "colour", train=4096, test=96, image_size=112)
    video = synthetic_data(work / "video", train=1024, test=48, image_size=112, families="video_colour")
    names = a.families.split(",")
    res: dict[str, Any] = result_head("families")
    iv, vv = a.steps // 4, a.video_steps // 2
    res["config"] = {
        "families": names,
        "steps": a.steps,
        "video_steps": a.video_steps,
        "image_val_steps": " / ".join(str(s) for s in range(0, a.steps + 1, iv)),
        "video_val_steps": " / ".join(str(s) for s in range(0, a.video_steps + 1, vv)),
    }
    res["families"] = {}
    from vlmrl.models.families import FAMILIES as FAMS

    for name in names:
        print(f"[bench_families] {name}", flush=True)
        ex = run_json_worker(
            [PY, __file__, "--exactness", name, "--out", str(work / f"{name}.json")],
            env=bench_env(1),
            out=work / f"{name}.json",
            what=f"exactness {name}",
        )
        res["families"][name] = {
            "exactness": ex,
            "image": learn(name, image, work / f"run-{name}-colour", a.steps, iv),
            "video": learn(name, video, work / f"run-{name}-video", a.video_steps, vv) if FAMS[name].videos else None,
        }
    default = names == list(FAMILIES) and a.steps == 80 and a.video_steps == 70
    publish("families", SECTION, res, markdown(res), None if default else work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
