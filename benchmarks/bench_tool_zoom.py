"""The multi-turn tool demo as a user runs it: ``bash examples/tool_zoom_cpu.sh`` and ``NO_TOOLS=1 bash
examples/tool_zoom_cpu.sh``, timed by part, and what each learns.

    python benchmarks/bench_tool_zoom.py [--runs 2] [--retries 1]
    python benchmarks/bench_tool_zoom.py --quick      # each variant once, SMOKE=1; nothing under results/

Each run is the script itself, unchanged, in a fresh output folder (``OUT``: data, warm start and run made anew),
the tool variant and the ``NO_TOOLS=1`` variant alternating, ``--runs`` times each. The model cache is the
benchmark's own (``VLMRL_CACHE`` under ``--work``), shared by the runs: the first run builds the tool-demo tiny model.
The script's own commands are traced with their start times (``common.traced_env``) to split its wall time into the
install check, the model, the data, the warm start, GRPO (the training command: start-up, validations, steps) and
the curve and report. From ``metrics.jsonl``: the median step time, the share of trajectories making a tool call
(``multi_turn/called_share``) over the first 5 and the last 10 steps, the training reward over the same windows and
the range of its 5-step mean, the first step where the 5-step mean reaches 0.9 and the training seconds to it,
validation at each validation step, and per 50-step range the calls that did not parse
(``multi_turn/error_kind/parse``) against all calls. From the model the script built: the tokens of the teacher's
``image_zoom`` call and of the hermes system message listing ``image_zoom``.

Each run holds the shared CPU lock (``$VLMRL_CPU_LOCK``); a run during which other processes used more than 10 % of
the machine is repeated (``--retries``). Writes ``benchmarks/results/tool_zoom.json`` (per run, and median / min /
max per variant) and the ``## Tool demo`` section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from bench_quickstart import UNSET, hit_and_seconds  # noqa: E402

SECTION = "Tool demo"
SCRIPT = "examples/tool_zoom_cpu.sh"
PARTS = (
    ("install_check", "bash scripts/install.sh"),
    ("model", "ensure_tiny_model"),
    ("data", "preprocess/synthetic.py"),
    ("warm_start", "-m vlmrl.testing.warm_start"),
    ("train", "-m vlmrl.train"),
    ("curve", "-m vlmrl.trainer.tracking"),
    ("report", "-m vlmrl.report"),
)
"""The script's parts, each starting at the first traced command containing its marker, in script order."""
VARIANTS = {"tools": {}, "no_tools": {"NO_TOOLS": "1"}}
BIN = 50
"""Steps per range of the parse-error counts (the config's validation interval)."""
WARM_LINE = r"\[warm_start\] step (\d+)/(\d+) loss ([\d.]+) called ([\d.]+) tool errors (\d+) \((\d+) s\)"
"""The warm start's progress line (vlmrl/testing/warm_start.py)."""


def mean(xs: list[float]) -> float | None:
    """Mean, or None for an empty list."""
    return sum(xs) / len(xs) if xs else None


def token_counts(model: Path) -> dict[str, int]:
    """Tokens of the teacher's ``image_zoom`` call (examples/tool_zoom/teacher.py) and of the hermes system message
    listing ``image_zoom``, with the tokenizer of the model the script built."""
    from transformers import AutoTokenizer

    from vlmrl.tools import hermes
    from vlmrl.tools.builtin import BUILTIN

    sys.path.insert(0, str(common.ROOT / "examples" / "tool_zoom"))
    import teacher  # examples/tool_zoom/teacher.py

    tok = AutoTokenizer.from_pretrained(str(model))
    call = "<tool_call>\n" + json.dumps({"name": "image_zoom", "arguments": {"bbox_2d": teacher.CENTRE}})
    call += "\n</tool_call>"
    system = hermes.system_prompt([BUILTIN["image_zoom"].default_schema])
    return {
        "call_tokens": len(tok(call, add_special_tokens=False)["input_ids"]),
        "system_tokens": len(tok(system, add_special_tokens=False)["input_ids"]),
        "call_text": call,
    }


def parse_ranges(train: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``BIN``-step range: the least and most calls that did not parse in a step, their total, and the least
    and most calls in a step (every name, unparsed included)."""
    out = []
    for lo in range(1, int(train[-1]["step"]) + 1, BIN):
        rows = [r for r in train if lo <= r["step"] < lo + BIN]
        if not rows:
            continue
        bad = [float(r.get("multi_turn/error_kind/parse", 0.0)) for r in rows]
        calls = [sum(v for k, v in r.items() if k.startswith("multi_turn/calls/")) for r in rows]
        out.append(
            {
                "steps": [lo, int(rows[-1]["step"])],
                "parse_min": min(bad),
                "parse_max": max(bad),
                "parse_total": sum(bad),
                "calls_min": min(calls),
                "calls_max": max(calls),
            }
        )
    return out


def learning(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's figures from its ``metrics.jsonl``."""
    train = [r for r in rows if r.get("step", 0) > 0 and "timing/step_s" in r]
    if not train:
        raise RuntimeError("metrics.jsonl has no training step")
    reward = [float(r["reward/mean"]) for r in train]
    ma5 = [sum(reward[i - 5 : i]) / 5 for i in range(5, len(reward) + 1)]
    called = [float(r["multi_turn/called_share"]) for r in train if "multi_turn/called_share" in r]
    hit, hit_s = hit_and_seconds(rows)
    return {
        "steps": int(train[-1]["step"]),
        "step_s": common.median([float(r["timing/step_s"]) for r in train]),
        "train_s": sum(float(r["timing/step_s"]) for r in train),
        "validate_s": sum(float(r.get("timing/validate_s", 0.0)) for r in rows if "val/reward/mean" in r),
        "val": {str(int(r["step"])): float(r["val/reward/mean"]) for r in rows if "val/reward/mean" in r},
        "reward_first5": mean(reward[:5]),
        "reward_last10": mean(reward[-10:]),
        "reward_ma5_min": min(ma5) if ma5 else None,
        "reward_ma5_max": max(ma5) if ma5 else None,
        "called_first5": mean(called[:5]),
        "called_last10": mean(called[-10:]),
        "hit_0.9_step": hit,
        "hit_0.9_train_s": hit_s,
        "parse_errors": parse_ranges(train) if called else [],
    }


def one_run(variant: str, k: int, a: argparse.Namespace) -> dict[str, Any]:
    """One run of the script (``variant``) in a fresh folder; its figures."""
    base = a.work / f"{variant}_{k}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    out, trace = base / "out", base / "trace.txt"
    env = {key: v for key, v in os.environ.items() if key not in (*UNSET, "NO_TOOLS")}
    env.update(OUT=str(out), VLMRL_CACHE=str(a.work / "cache"), RAY_TMPDIR=tempfile.mkdtemp(prefix="vlmrl-bench-ray-"))
    env.update(VARIANTS[variant])
    if a.quick:
        env["SMOKE"] = "1"
    env = common.traced_env(env, trace)
    what = f"tool_zoom {variant} run {k}"
    run = common.run_locked(["bash", SCRIPT], env=env, log=base / "script.log", timeout_s=3600, what=what)
    log = Path(run["log"]).read_text(errors="replace")
    if run["returncode"] != 0:
        raise RuntimeError(f"{SCRIPT} ({variant}) failed (exit {run['returncode']}); log {run['log']}:\n{log[-4000:]}")
    parts = common.script_phases(trace, PARTS, run["started_epoch"], run["started_epoch"] + run["wall_s"])
    warm = re.findall(WARM_LINE, log)
    m = re.search(r"\[tool_zoom\] tiny model: (\S+)", log)
    res: dict[str, Any] = {
        "variant": variant,
        "run": k,
        "wall_s": run["wall_s"],
        "parts_s": parts,
        **learning(common.read_jsonl(out / "metrics.jsonl")),
        "warm_start_steps": int(warm[-1][1]) if warm else None,
        "warm_start_called_last": float(warm[-1][3]) if warm else None,
        "model": m.group(1) if m else None,
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }
    res["train_other_s"] = parts.get("train", 0.0) - res["train_s"] - res["validate_s"]
    return res


SUMMARY_KEYS = (
    "wall_s",
    "step_s",
    "train_s",
    "validate_s",
    "train_other_s",
    "reward_first5",
    "reward_last10",
    "reward_ma5_min",
    "reward_ma5_max",
    "called_first5",
    "called_last10",
    "hit_0.9_step",
    "hit_0.9_train_s",
)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max over one variant's runs of every figure, each part, each validation and each range's
    parse errors."""
    out = {key: common.spread([r[key] for r in runs]) for key in SUMMARY_KEYS}
    for part in {p for r in runs for p in r["parts_s"]}:
        out[f"parts_s/{part}"] = common.spread([r["parts_s"].get(part) for r in runs])
    for step in sorted({s for r in runs for s in r["val"]}, key=int):
        out[f"val/{step}"] = common.spread([r["val"].get(step) for r in runs])
    ranges = [r["parse_errors"] for r in runs if r["parse_errors"]]
    for i, rng in enumerate(ranges[0] if ranges else []):
        lo, hi = rng["steps"]
        out[f"parse/{lo}-{hi}"] = {
            "parse_min": min(x[i]["parse_min"] for x in ranges if len(x) > i),
            "parse_max": max(x[i]["parse_max"] for x in ranges if len(x) > i),
            "calls_min": min(x[i]["calls_min"] for x in ranges if len(x) > i),
            "calls_max": max(x[i]["calls_max"] for x in ranges if len(x) > i),
        }
    return out


def _rng(v: dict[str, Any], fmt: str) -> str:
    if v["median"] is None:
        return "-"
    if f"{v['min']:{fmt}}" == f"{v['max']:{fmt}}":
        return f"{v['median']:{fmt}}"
    return f"{v['median']:{fmt}} ({v['min']:{fmt}}-{v['max']:{fmt}})"


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    c = res["config"]
    lines = [
        f"`python benchmarks/bench_tool_zoom.py --runs {c['runs']}` ({res['date']}). `bash {SCRIPT}` (tools) and "
        f"`NO_TOOLS=1 bash {SCRIPT}` (no tools) as a user runs them, alternating, {c['runs']} time(s) each, each in "
        "a fresh output folder (data, warm start and run made anew; the model cache shared). Parts timed from the "
        "script's own commands (bash's `set -x` with timestamps, through `BASH_ENV`); training seconds: the sum of "
        "the steps' `timing/step_s`. Median over the runs, (min-max) where they differ.",
        "",
    ]
    header = ["figure", "tools", "no tools"]
    s = res["summary"]
    keys = [
        ("script s", "wall_s", ".0f"),
        ("install check s", "parts_s/install_check", ".1f"),
        ("model s", "parts_s/model", ".1f"),
        ("data s", "parts_s/data", ".0f"),
        ("warm start s", "parts_s/warm_start", ".0f"),
        ("GRPO command s", "parts_s/train", ".0f"),
        ("s/step", "step_s", ".2f"),
        ("steps s (sum)", "train_s", ".0f"),
        ("validation s (sum)", "validate_s", ".0f"),
        ("start-up and the rest s", "train_other_s", ".0f"),
        ("called share, first 5 steps", "called_first5", ".2f"),
        ("called share, last 10 steps", "called_last10", ".2f"),
        ("training reward, first 5 steps", "reward_first5", ".2f"),
        ("training reward, last 10 steps", "reward_last10", ".2f"),
        ("5-step mean reward, lowest", "reward_ma5_min", ".2f"),
        ("5-step mean reward, highest", "reward_ma5_max", ".2f"),
        ("5-step mean >= 0.9 at step", "hit_0.9_step", ".0f"),
        ("training s to it", "hit_0.9_train_s", ".0f"),
    ]
    vsteps = sorted({k.split("/")[1] for v in s.values() for k in v if k.startswith("val/")}, key=int)
    keys += [(f"validation at step {st}", f"val/{st}", ".2f") for st in vsteps]
    rows = [[label] + [_rng(s[v][key], fmt) if key in s[v] else "-" for v in VARIANTS] for label, key, fmt in keys]
    lines.append(common.table(header, rows))
    ranges = [(k.split("/", 1)[1], v) for k, v in s["tools"].items() if k.startswith("parse/")]
    if ranges:
        lines += ["", "Calls that did not parse (`multi_turn/error_kind/parse`), per step, tools runs:", ""]
        rows = [
            [f"steps {k}", f"{v['parse_min']:.0f}-{v['parse_max']:.0f}", f"{v['calls_min']:.0f}-{v['calls_max']:.0f}"]
            for k, v in ranges
        ]
        lines.append(common.table(["steps", "calls not parsed per step", "calls per step"], rows))
    t = res["tokens"]
    lines += [
        "",
        f"Tool-demo tokenizer: the teacher's `image_zoom` call is {t['call_tokens']} tokens, the hermes system "
        f"message listing `image_zoom` {t['system_tokens']}.",
        "",
        "| run | variant | script s | s/step | validation | CPU used by others |",
        "|---|---|---:|---:|---|---:|",
    ]
    for v in VARIANTS:
        for r in res["runs"][v]:
            val = " / ".join(f"{x:.2f}" for _, x in sorted(r["val"].items(), key=lambda kv: int(kv[0])))
            lines.append(
                f"| {r['run']} | {v} | {r['wall_s']:.0f} | {r['step_s']:.2f} | {val} | {r['foreign_cpu_frac']:.0%} |"
            )
    lines += ["", common.machine_line(res), "Raw numbers: `benchmarks/results/tool_zoom.json`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both variants ``--runs`` times, alternating; write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2, help="runs of each variant")
    p.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10%% of the CPU")
    p.add_argument("--quick", action="store_true", help="each variant once with SMOKE=1; results only under --work")
    p.add_argument("--work", type=Path, default=common.ROOT / ".cache" / "bench" / "tool_zoom")
    a = p.parse_args(argv)
    n = 1 if a.quick else a.runs
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for k in range(1, n + 1):
        for variant in VARIANTS:
            r = common.uncontended(lambda v=variant, k=k: one_run(v, k, a), f"tool_zoom {variant} {k}", a.retries)
            runs[variant].append(r)
            print(
                f"[bench_tool_zoom] {variant} run {k}: script {r['wall_s']:.0f} s, {r['step_s']:.2f} s/step, "
                f"called {r['called_first5']} -> {r['called_last10']}, val {r['val']}",
                flush=True,
            )
    model = next((r["model"] for r in runs["tools"] if r["model"]), None)
    res = {
        **common.result_head("tool_zoom"),
        "config": {"runs": n, "script": SCRIPT, "smoke": a.quick, "retries": a.retries, "bin_steps": BIN},
        "runs": runs,
        "summary": {v: summarise(rs) for v, rs in runs.items()},
        "tokens": token_counts(Path(model)) if model else {},
    }
    common.publish("tool_zoom", SECTION, res, markdown(res), a.work if a.quick else None)
    return res


if __name__ == "__main__":
    main()
