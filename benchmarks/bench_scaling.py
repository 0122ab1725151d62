"""Scaling: vlmrl GRPO step time vs prompts per step and vs image size, on the tiny Qwen2.5-VL (2 CPU worker processes).

    python benchmarks/bench_scaling.py [--prompts 4,8,16,32] [--image-sizes 56,112,224] [--steps 6]

Prompts sweep: 56x56 images, n=8, 16 tokens (``ignore_eos``), ``ppo_mini_batch_size`` = prompts (one optimizer step).
Image sweep: 16 prompts, images of S x S pixels (4 / 16 / 64 image tokens), on a tiny model whose processor allows
224x224 (``TinySpec.max_pixels`` raised, ``data.max_pixels`` matching) so the engine and the trainer see the image at
full size. Each point is one run of ``--steps`` steps; the first ``--warmup`` are dropped; median step time and its
stages. Linearity: the step time is fitted as ``a + b * x`` by least squares (x = samples, or image tokens per
prompt); the table gives time per unit of x at each point and the fit's R^2; "linear" when R^2 >= 0.98.

Each run holds the shared CPU lock. Writes ``benchmarks/results/scaling.json`` and the ``## Scaling`` section.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Scaling"
STAGES = ("timing/rollout_s", "timing/reward_s", "timing/update_s", "timing/push_s", "timing/input_prep_s")
BIG_PIXELS = 224 * 224


def point(a: argparse.Namespace, model: Path, data: Path, prompts: int, extra: list[str], tag: str) -> dict[str, Any]:
    """One run: median step time and stage times over the measured steps."""
    over = [
        f"data.train_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={max(64, prompts * 8 // 2)}",
        "actor_rollout_ref.rollout.n=8",
        f"data.max_response_length={a.max_tokens}",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "data.max_prompt_length=200",
        "actor_rollout_ref.rollout.max_model_len=256",
        *extra,
    ]
    run = common.uncontended(lambda: common.vlmrl_train(Path(a.work) / tag, data, model, a.steps, over), tag, a.retries)
    rows = run["rows"][a.warmup :]
    if len(rows) < a.steps - a.warmup:
        raise RuntimeError(f"{tag}: only {len(run['rows'])} of {a.steps} steps; log {run['log']}")
    out = {"step_s": common.median([r["timing/step_s"] for r in rows]), "foreign_cpu_frac": run["foreign_cpu_frac"]}
    for k in STAGES:
        out[k.split("/")[1]] = common.median([r.get(k, 0.0) for r in rows])
    out["step_times_s"] = [r["timing/step_s"] for r in rows]
    return out


def linear_fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """Least-squares ``y = a + b x`` and its R^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a0 = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - a0 - b * x) ** 2 for x, y in zip(xs, ys))
    return {"intercept_s": a0, "slope_s": b, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def sweep_table(points: list[dict[str, Any]], xname: str, fit: dict[str, float]) -> str:
    """Markdown table of one sweep."""
    rows = []
    base = points[0]
    for p in points:
        rows.append(
            [
                p["label"],
                f"{p['x']:g}",
                f"{p['step_s']:.3f}",
                f"{p['step_s'] / base['step_s']:.2f}x (x{p['x'] / base['x']:g})",
                f"{p['step_s'] / p['x'] * 1000:.1f}",
                f"{p['rollout_s']:.3f}",
                f"{p['update_s']:.3f}",
                f"{p['push_s']:.3f}",
                f"{p['reward_s'] + p['input_prep_s']:.3f}",
                f"{p['foreign_cpu_frac']:.0%}",
            ]
        )
    header = ["point", xname, "s/step", "vs first (x growth)", f"ms per {xname}", "rollout s", "update s", "push s"]
    header += ["reward + inputs s", "CPU used by others"]
    verdict = "linear" if fit["r2"] >= 0.98 else "not linear"
    return (
        common.table(header, rows)
        + f"\n\nFit: step = {fit['intercept_s']:.3f} s + {fit['slope_s'] * 1000:.2f} ms x {xname}, "
        f"R^2 = {fit['r2']:.3f} -> **{verdict}** (fixed cost {fit['intercept_s']:.3f} s per step)."
    )


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    c = res["config"]
    lines = [
        f"`python benchmarks/bench_scaling.py --steps {c['steps']}` ({res['date']}). vlmrl, tiny Qwen2.5-VL, 2 worker "
        f"processes x 1 thread, n=8, {c['max_tokens']} tokens (`ignore_eos`), one optimizer step per batch; "
        f"median of steps {c['warmup'] + 1}-{c['steps']} of one run per point.",
        "",
        "**Prompts per step** (56x56 images, 4 image tokens):",
        "",
        sweep_table(res["prompts_sweep"], "samples", res["prompts_fit"]),
        "",
        f"**Image size** (16 prompts; tiny model with max_pixels {BIG_PIXELS}):",
        "",
        sweep_table(res["image_sweep"], "image tokens", res["image_fit"]),
        "",
        common.machine_line(res),
        "Raw numbers: `benchmarks/results/scaling.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both sweeps, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="4,8,16,32")
    p.add_argument("--image-sizes", default="56,112,224")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--retries", type=int, default=1, help="re-runs of a run during which others used > 10%% CPU")
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "scaling"))
    a = p.parse_args(argv)
    if a.steps <= a.warmup:
        p.error("--steps must exceed --warmup")
    prompt_sizes = [int(x) for x in a.prompts.split(",")]
    image_sizes = [int(x) for x in a.image_sizes.split(",")]
    if any(x % 2 for x in prompt_sizes):
        p.error("prompts per step must be even (2 workers)")
    work = Path(a.work)
    model = common.tiny_model(seed=0)
    data56 = common.synthetic_data(work / "data56", train=512, test=16, image_size=56)
    ps = []
    for k in prompt_sizes:
        print(f"[bench_scaling] {k} prompts per step", flush=True)
        r = point(a, model, data56, k, [], f"prompts_{k}")
        ps.append({"label": f"{k} prompts", "x": k * 8, "prompts": k, **r})
        print(f"[bench_scaling]   {r['step_s']:.3f} s/step", flush=True)
    big = common.tiny_model(seed=0, max_pixels=BIG_PIXELS)
    ims = []
    for s in image_sizes:
        data = common.synthetic_data(work / f"data{s}", train=256, test=16, image_size=s)
        tokens = (s // 28) ** 2
        print(f"[bench_scaling] {s}x{s} images ({tokens} image tokens)", flush=True)
        r = point(a, big, data, 16, [f"data.max_pixels={BIG_PIXELS}"], f"image_{s}")
        ims.append({"label": f"{s}x{s}", "x": tokens, "image_size": s, **r})
        print(f"[bench_scaling]   {r['step_s']:.3f} s/step", flush=True)
    res = {
        **common.result_head("scaling"),
        "config": {"steps": a.steps, "warmup": a.warmup, "max_tokens": a.max_tokens, "n": 8},
        "prompts_sweep": ps,
        "prompts_fit": linear_fit([q["x"] for q in ps], [q["step_s"] for q in ps]),
        "image_sweep": ims,
        "image_fit": linear_fit([q["x"] for q in ims], [q["step_s"] for q in ims]),
    }
    common.write_result("scaling", res)
    common.write_readme_section(SECTION, markdown(res))
    print(markdown(res))
    return res


if __name__ == "__main__":
    main()
