"""The launch's start-up: from the command to the quick start's first training step, stage by stage.

    python benchmarks/bench_startup.py [--runs 3] [--label after]
    python benchmarks/bench_startup.py --quick      # one run; writes nothing under results/

Each run is the quick start's training command (``python -m vlmrl.train --config-name tiny_cpu`` on the quick start's
data and the tiny model, as ``examples/quickstart_cpu.sh`` runs it: 2 local CPU workers, the vLLM rollout, greedy
validation before training) stopped after one step, in a fresh output folder, after one run that is not counted
(vLLM's and the OS's caches warm, as on every launch but a machine's first). The trainer prints its start-up when
the first step begins (``[vlmrl] start-up: T s to the first step (interpreter ..., config ..., imports ...,
processor ..., data ..., reward ..., loggers ..., workers ... (the slowest worker's own split), validation ...)``,
``vlmrl.timing.StartupClock``); the run's ``timing/startup_s`` is the same total. Each run holds the shared CPU
lock (``$VLMRL_CPU_LOCK``); a run during which other processes used more than 10 % of the machine is repeated
(``--retries``).

``--label`` names the measurement (e.g. ``before`` and ``after`` a change): ``benchmarks/results/startup.json`` keeps
one entry per label, each with its commit, whether the checkout had uncommitted changes, the date and the machine;
the ``## Start-up`` section of ``benchmarks/README.md`` tabulates them side by side.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Start-up"
LINE = re.compile(r"\[vlmrl\] start-up: ([\d.]+) s to the first step \((.*)\)$", re.M)
PART = re.compile(r"([a-z][a-z ]*?) ([\d.]+)(?: \(([^)]*)\))?(?:, |$)")
WORKER = re.compile(r"ready ([\d.]+) s after its process started: engine ([\d.]+), model ([\d.]+)")


def parse_line(log: str) -> dict[str, Any]:
    """The start-up line's total, its stages and the slowest worker's split (``ready_s``, ``engine_s``,
    ``model_s``)."""
    m = LINE.search(log)
    if m is None:
        raise RuntimeError(f"no start-up line in the run's output:\n{log[-3000:]}")
    parts, worker = {}, {}
    for name, seconds, detail in PART.findall(m.group(2)):
        parts[name.strip()] = float(seconds)
        w = WORKER.search(detail or "")
        if w:
            worker = {"ready_s": float(w.group(1)), "engine_s": float(w.group(2)), "model_s": float(w.group(3))}
    return {"total_s": float(m.group(1)), "parts_s": parts, "slowest_worker": worker}


def one_run(k: int, work: Path, model: Path, data: Path) -> dict[str, Any]:
    """One launch stopped after its first step: the start-up line, the command's wall time, ``timing/startup_s``."""
    out = work / f"run_{k}"
    cmd = [
        common.PY,
        "-m",
        "vlmrl.train",
        "--config-name",
        "tiny_cpu",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=1",
        "trainer.logger=[console,jsonl]",
        "trainer.resume_mode=disable",
        "trainer.val_before_train=true",
    ]
    run = common.run_locked(
        cmd, env=common.bench_env(1), log=out / "train.log", timeout_s=600, what=f"start-up run {k}"
    )
    log = Path(run["log"]).read_text(errors="replace")
    if run["returncode"] != 0:
        raise RuntimeError(f"the launch failed (exit {run['returncode']}):\n{log[-4000:]}")
    step1 = next(r for r in common.read_jsonl(out / "metrics.jsonl") if r.get("step") == 1)
    return {
        "run": k,
        **parse_line(log),
        "timing/startup_s": step1.get("timing/startup_s"),
        "command_s": run["wall_s"],
        "foreign_cpu_frac": run["foreign_cpu_frac"],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of the total, each stage and the slowest worker's split."""
    names = list(dict.fromkeys(n for r in runs for n in r["parts_s"]))
    return {
        "total_s": common.spread([r["total_s"] for r in runs]),
        "command_s": common.spread([r["command_s"] for r in runs]),
        "parts_s": {n: common.spread([r["parts_s"].get(n) for r in runs]) for n in names},
        "slowest_worker": {
            k: common.spread([r["slowest_worker"].get(k) for r in runs]) for k in ("ready_s", "engine_s", "model_s")
        },
    }


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section: one column per label."""
    labels = list(res["labels"])
    names = list(dict.fromkeys(n for lab in labels for n in res["labels"][lab]["summary"]["parts_s"]))

    def med(d: dict[str, Any] | None) -> str:
        return "-" if not d or d.get("median") is None else f"{d['median']:.1f}"

    rows = [["to the first step", *[med(res["labels"][lab]["summary"]["total_s"]) for lab in labels]]]
    rows += [[n, *[med(res["labels"][lab]["summary"]["parts_s"].get(n)) for lab in labels]] for n in names]
    for key, what in (
        ("ready_s", "slowest worker: ready after its process started"),
        ("engine_s", "... its vLLM engine"),
        ("model_s", "... its policy (load, FSDP2, optimizer)"),
    ):
        rows.append([what, *[med(res["labels"][lab]["summary"]["slowest_worker"].get(key)) for lab in labels]])
    heads = [
        f"{lab} ({res['labels'][lab]['commit'][:10]}{', dirty' if res['labels'][lab]['dirty'] else ''}, "
        f"{res['labels'][lab]['date']})"
        for lab in labels
    ]
    first = res["labels"][labels[0]]
    return "\n".join(
        [
            f"`python benchmarks/bench_startup.py --runs {first['runs_asked']} --label LABEL`: the quick start's "
            "training command (tiny model, quick start data, 2 local CPU workers, vLLM, validation before training) to "
            "its first step, after one launch that is not counted; median seconds of the runs, per stage as the "
            "trainer prints them (`[vlmrl] start-up: ...`).",
            "",
            common.table(["stage (s)", *heads], rows),
            "",
            common.machine_line(res),
            "Raw numbers: `benchmarks/results/startup.json`.",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run, and write the label's entry into results/startup.json and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--label", default="current", help="the measurement's name in the results file")
    p.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10%% of the CPU")
    p.add_argument("--quick", action="store_true", help="one run; results only under --work")
    p.add_argument("--work", type=Path, default=common.ROOT / ".cache" / "bench" / "startup")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=a.work))
    model = common.tiny_model()
    data = common.synthetic_data(work / "data", 4096, 96, 112)
    n = 1 if a.quick else a.runs
    one_run(0, work, model, data)  # not counted: vLLM's model-info cache, the page cache
    runs = [
        common.uncontended(lambda k=k: one_run(k, work, model, data), f"start-up run {k}", a.retries)
        for k in range(1, n + 1)
    ]
    for r in runs:
        print(f"[bench_startup] run {r['run']}: {r['total_s']:.1f} s to the first step {r['parts_s']}", flush=True)
    prov = common.provenance()
    entry = {
        "commit": prov["commit"],
        "dirty": prov["dirty"],
        "date": common.now(),
        "machine": common.machine(),
        "runs_asked": n,
        "runs": runs,
        "summary": summary(runs),
    }
    path = common.RESULTS / "startup.json"
    res = json.loads(path.read_text()) if path.exists() and not a.quick else {}
    res = {
        **common.result_head("startup"),
        "command": "python benchmarks/bench_startup.py --runs N --label LABEL",
        "labels": {**res.get("labels", {}), a.label: entry},
    }
    common.publish("startup", SECTION, res, markdown(res), work if a.quick else None)
    return res


if __name__ == "__main__":
    main()
