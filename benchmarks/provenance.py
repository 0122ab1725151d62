"""Where each results file's figures come from, and how old they are against the code.

``python benchmarks/provenance.py`` prints, for every ``benchmarks/results/*.json``: when and on which machine it was
measured, at which commit, with which command, and how many commits have changed the measured code (``vlmrl/``,
``rewards/``, ``configs/``, ``preprocess/``, ``examples/`` and the benchmark's own script) since. It reports; it does
not fail: a figure is re-measured when its code changed in a way that matters, which a reader judges.

Results files written before the writer recorded the commit (``common.write_result`` refuses to write without it
now) have none; they record the commit that committed them (``committed_in``), shown marked so: the measurement
ran at or before it.
The documentation site shows the same provenance under every page that quotes a results file (``docs/hooks.py``).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MEASURED_CODE = ("vlmrl", "rewards", "configs", "preprocess", "examples")
"""The folders whose changes can move a figure (besides the benchmark's own script)."""

COMMANDS = {
    "quickstart.json": "python benchmarks/bench_quickstart.py",
    "tool_zoom.json": "python benchmarks/bench_tool_zoom.py",
    "suite.json": "python benchmarks/bench_suite.py",
    "trl.json": "python benchmarks/bench_trl.py",
    "video.json": "python benchmarks/bench_video.py",
    "push.json": "python benchmarks/bench_push.py",
    "dynamic_bsz.json": "python benchmarks/bench_dynamic_bsz.py",
    "ppo.json": "python benchmarks/bench_ppo.py",
    "async.json": "python benchmarks/bench_async.py",
    "async_tools.json": "python benchmarks/bench_async_tools.py",
    "gpu.json": "bash benchmarks/gpu_check.sh",
    "trl_sizes.json": "python benchmarks/bench_trl.py --model-size tiny,20m,100m",
    "packing.json": "python benchmarks/bench_packing.py",
    "families.json": "python benchmarks/bench_families.py",
    "limits.json": "python benchmarks/bench_limits.py",
    "reward_model.json": "python benchmarks/bench_reward_model.py",
    "data.json": "python benchmarks/bench_data.py",
    "fixed_cost.json": "python benchmarks/bench_scaling.py --steps 12 --image-sizes 56",
    "memory.json": "python benchmarks/bench_memory.py",
    "reward.json": "python benchmarks/bench_reward.py",
    "rollout.json": "python benchmarks/bench_rollout.py",
    "scaling.json": "python benchmarks/bench_scaling.py",
    "startup.json": "python benchmarks/bench_startup.py",
}
"""The command that writes each results file (benchmarks/README.md has their arguments); a file that records its
own command is described by that."""


def _git(*args: str) -> str:
    out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def script_of(command: str) -> str | None:
    """The benchmark script a command runs (``benchmarks/...``), if any."""
    return next((w for w in command.split() if w.startswith("benchmarks/")), None)


def command_of(name: str) -> str:
    """The command that wrote ``benchmarks/results/<name>`` (recorded in it, else ``COMMANDS``)."""
    return json.loads((RESULTS / name).read_text()).get("command") or COMMANDS.get(name, "")


@functools.cache
def of(name: str) -> dict[str, Any]:
    """The provenance of ``benchmarks/results/<name>``: date, machine (CPU model and cores, or the GPU), commit,
    whether it was recorded (else the commit that added the file), dirty, command, and the commits since that
    changed the measured code."""
    data = json.loads((RESULTS / name).read_text())
    machine = data.get("machine") or {}
    commit = data.get("commit")
    recorded = bool(commit)
    if not recorded:  # written before results recorded their commit: the commit that committed it (kept in the file)
        commit = (
            data.get("committed_in") or _git("log", "-1", "--format=%H", "--", f"benchmarks/results/{name}") or None
        )
    command = data.get("command") or COMMANDS.get(name, "")
    paths = [*MEASURED_CODE, *([s] if (s := script_of(command)) else [])]
    since = _git("rev-list", "--count", f"{commit}..HEAD", "--", *paths) if commit else ""
    where = machine.get("gpu") or machine.get("cpu") or "?"
    if machine.get("cpu_count"):
        where += f", {machine['cpu_count']} CPU cores"
    return {
        "file": name,
        "date": str(
            data.get("date")
            or data.get("when")
            or _git("log", "-1", "--format=%cs", "--", f"benchmarks/results/{name}")
        ),
        "machine": where,
        "commit": commit,
        "recorded": recorded,
        "dirty": data.get("dirty"),
        "command": command,
        "code_commits_since": int(since) if since.isdigit() else None,
    }


def describe(p: dict[str, Any]) -> str:
    """One line of provenance for a reader."""
    commit = (p["commit"] or "?")[:8]
    at = (
        f"commit {commit}" + (" (tree dirty)" if p["dirty"] else "")
        if p["recorded"]
        else (f"at or before commit {commit}, which committed it (the file predates recorded commits)")
    )
    since = p["code_commits_since"]
    age = "" if since is None else f"; {since} commit(s) to the measured code since"
    return f"`{p['file']}`: measured {p['date']} on {p['machine']}, {at}{age}; `{p['command']}`"


def main() -> None:
    """Print every results file's provenance, the ones whose code changed most first."""
    rows = [of(f.name) for f in sorted(RESULTS.glob("*.json"))]
    rows.sort(key=lambda p: -(p["code_commits_since"] or 0))
    for p in rows:
        print(describe(p).replace("`", ""))
    print(f"{len(rows)} results files; re-measure with the command shown (benchmarks/README.md)", file=sys.stderr)


if __name__ == "__main__":
    main()
