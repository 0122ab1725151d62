"""Memory soak: resident memory of every process of a vlmrl run (driver, the hybrid workers with their in-process
vLLM engines, Ray's own daemons where Ray runs) over ``--steps`` GRPO steps on the tiny model with images. vLLM's
multimodal preprocessor cache is off, as vlmrl always runs it (the config gate refuses turning it on: it keeps every
new image's processed inputs, so host memory grows with the images seen; EasyR1 #159, vLLM #12973).

    python benchmarks/bench_memory.py [--steps 200]

A thread polls the run's process tree with psutil every ``--interval-s`` seconds and tags each sample with the number
of finished steps (lines of metrics.jsonl). Growth is measured between the median RSS around step 20 (steps 15-25)
and the median RSS over the last 10 steps (``steps-10`` to ``steps-1``, before shutdown); goal: growth of the sum of
the driver's and the workers' RSS < 5 %. Every prompt of the run is a distinct image (no repeats), as in real RL.
The run holds the shared CPU lock; it writes ``benchmarks/results/memory.json`` and the ``## Memory soak`` section of
``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Memory soak"
ROLES = ("driver", "worker", "ray")


def window(samples: list[dict[str, Any]], lo: int, hi: int) -> dict[str, float]:
    """Median RSS (bytes) per role and in total over the samples taken while ``lo <= finished steps <= hi``."""
    sel = [s for s in samples if lo <= s["step"] <= hi]
    if not sel:
        raise RuntimeError(f"no memory samples between steps {lo} and {hi}; polling too slow for this run")
    out = {r: common.median([s["by_role"].get(r, 0) for s in sel]) for r in ROLES}
    out["driver+workers"] = out["driver"] + out["worker"]
    out["all"] = common.median([s["total"] for s in sel])
    out["samples"] = len(sel)
    return out


def slope_mib_per_100_steps(samples: list[dict[str, Any]], lo: int, hi: int) -> float:
    """Least-squares slope of driver+workers RSS against steps, in MiB per 100 steps."""
    pts = [(s["step"], s["by_role"].get("driver", 0) + s["by_role"].get("worker", 0)) for s in samples]
    pts = [(x, y) for x, y in pts if lo <= x <= hi]
    if len(pts) < 3:
        return float("nan")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den * 100 / 2**20 if den else float("nan")


def soak(steps: int, a: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    """One run; returns its windows, growth, slope, the raw samples (thinned) and the step-time median."""
    over = [f"data.max_response_length={a.max_tokens}", "data.shuffle=false"]
    sampler = common.RssSampler(a.interval_s)
    run = common.vlmrl_train(Path(a.work) / "run", data, model, steps, over, timeout_s=a.timeout_s, sampler=sampler)
    rows = run["rows"]
    if len(rows) < steps:
        raise RuntimeError(f"only {len(rows)} of {steps} steps finished; log {run['log']}")
    early = window(sampler.samples, 15, 25)
    late = window(sampler.samples, steps - 10, steps - 1)
    growth = {k: late[k] / early[k] - 1 for k in (*ROLES, "driver+workers", "all") if early[k]}
    return {
        "steps": len(rows),
        "rss_step20": early,
        "rss_end": late,
        "growth": growth,
        "slope_mib_per_100_steps": slope_mib_per_100_steps(sampler.samples, 20, steps - 1),
        "step_s_median": common.median([r["timing/step_s"] for r in rows[2:]]),
        "reward_last10": sum(r["reward/mean"] for r in rows[-10:]) / 10,
        "samples": [{"t": round(s["t"], 2), "step": s["step"], **s["by_role"]} for s in sampler.samples[:: a.thin]],
        "wall_s": run["wall_s"],
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }


def markdown(res: dict[str, Any]) -> str:
    """The README section."""
    c = res["config"]
    lines = [
        f"`python benchmarks/bench_memory.py --steps {c['steps']}` ({res['date']}). Tiny Qwen2.5-VL, `tiny_cpu` "
        f"config (2 worker processes, {c['prompts']} prompts x n={c['n']}, {c['max_tokens']} response tokens, one "
        f"{c['image_size']}x{c['image_size']} image per prompt, every image distinct). RSS sampled every "
        f"{c['interval_s']} s over the run's whole process tree; 'step 20' = median over steps 15-25, 'end' = median "
        f"over steps {c['steps'] - 10}-{c['steps'] - 1}. Goal: driver + workers growth < 5 %.",
        "",
    ]
    rows = []
    for r in [res["run"]]:
        g = r["growth"]
        ok = "met" if g["driver+workers"] < 0.05 else "NOT met"
        rows.append(
            [
                f"{r['rss_step20']['driver+workers'] / 2**20:,.0f}",
                f"{r['rss_end']['driver+workers'] / 2**20:,.0f}",
                f"**{g['driver+workers'] * 100:+.1f} %** ({ok})",
                f"{g['driver'] * 100:+.1f} % / {g['worker'] * 100:+.1f} %",
                f"{r['slope_mib_per_100_steps']:+.1f}",
                f"{r['rss_step20']['all'] / 2**20:,.0f} -> {r['rss_end']['all'] / 2**20:,.0f} "
                f"({g['all'] * 100:+.1f} %)",
                f"{r['step_s_median']:.2f}",
            ]
        )
    header = ["driver+workers MiB @20", "@end", "growth", "driver / workers growth"]
    header += ["slope MiB/100 steps", "all processes (and Ray's daemons where Ray runs) MiB", "s/step"]
    lines.append(common.table(header, rows))
    lines += [
        "",
        "vLLM's multimodal preprocessor cache is off, as vlmrl always runs it (the config gate refuses turning it "
        "on: it would keep every new image's processed inputs, so memory would grow with the images seen). The "
        "slope is the clearer signal of a leak: what remains is allocator noise.",
        "",
        common.machine_line(res),
        "Raw numbers and the (thinned) RSS samples: `benchmarks/results/memory.json`.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the soak(s), merge into the results file, update the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--interval-s", type=float, default=0.5)
    p.add_argument("--thin", type=int, default=4, help="keep every k-th RSS sample in the results file")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--work", default=str(common.ROOT / ".cache" / "bench" / "memory"))
    a = p.parse_args(argv)
    if a.steps < 40:
        p.error("--steps must be >= 40 (growth is measured from step 20 to the end)")
    prompts, n = 16, 8
    model = common.tiny_model(seed=0)
    # enough distinct records that no image repeats during the run
    data = common.synthetic_data(Path(a.work) / "data", train=max(4096, prompts * a.steps), test=32)
    print(f"[bench_memory] {a.steps} steps", flush=True)
    run = soak(a.steps, a, model, data)
    print(f"[bench_memory]   driver+workers growth {run['growth']['driver+workers'] * 100:+.2f} %", flush=True)
    res = {
        **common.result_head("memory"),
        "config": {
            "steps": a.steps,
            "prompts": prompts,
            "n": n,
            "max_tokens": a.max_tokens,
            "image_size": 56,
            "interval_s": a.interval_s,
        },
        "run": run,
    }
    common.write_result("memory", res)
    common.write_readme_section(SECTION, markdown(res))
    return res


if __name__ == "__main__":
    main()
