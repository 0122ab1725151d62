"""The test command on a clean clone, as CI runs it: ``git clone`` of this repository at HEAD into a new folder,
then the README's ``bash scripts/test.sh --all`` there (its first install included), timed by part: the install,
the contributor tier (the tests not marked ``slow``: what ``bash scripts/test.sh`` runs, and the first thing
``--all`` runs) and the slow tier.

    python benchmarks/bench_suite.py [--runs 1]
    python benchmarks/bench_suite.py --tier fast  # the contributor tier only (bash scripts/test.sh)
    python benchmarks/bench_suite.py --quick      # the clone's test.sh, the checkout's .venv, tests/test_algos.py

What is measured is the committed HEAD (``git clone`` of the checkout; uncommitted changes are not in it: the result
records the commit and whether the checkout had changes). The clone gets no environment that would change the command
(no ``VLMRL_VENV``, ``VLMRL_CACHE``, ``PYTHONPATH`` or activated venv), so ``scripts/install.sh`` creates the clone's
own ``.venv`` (pip's download cache stays as it is on the machine; ``--no-pip-cache`` turns it off) and
``scripts/install_browser.sh`` installs Chromium when none is there (the result records whether one was). The command's
own steps are traced with their start times (``common.traced_env``) to split its wall time into the install, the browser
and each tier's pytest runs. pytest writes ``--junitxml``: tests, passed, failed, errors, skipped (and which skips name
CUDA or a GPU), and pytest's own time, for each tier. Afterwards: the size of the clone's ``.venv`` on disk and the
parts of it that only a GPU uses (NVIDIA's CUDA wheels ``nvidia*``, ``cuda*``, torch's ``libtorch_cuda*`` and
``libc10_cuda``, triton). While it runs, ``VLMRL_MEASURING_SUITE=1`` tells ``tests/test_readme_figures.py`` to leave out
the README figures this run is measuring (those tied to ``suite.json``).

The run holds the shared CPU lock (``$VLMRL_CPU_LOCK``); a run during which other processes used more than 10 % of
the machine is repeated (``--retries``). Writes ``benchmarks/results/suite.json`` and the ``## Test suite`` section
of ``benchmarks/README.md``, and ``tests/durations.json`` (each test's own seconds, setup and teardown included but the
setup of fixtures it shares with other tests, which go to its module's entry, by node
id: tests/test_suite_tiers.py checks the tiers against it, and ``tests/conftest.py`` starts the parallel run with the
heaviest modules); the clone is removed afterwards (``--keep`` keeps it; ``--durations-from KEPT/junit.xml`` writes
only the durations file from a kept run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "Test suite"
PARTS = (
    ("install", "bash scripts/install.sh"),
    ("browser", "bash scripts/install_browser.sh"),
    ("fast", "[tests] contributor tier"),
    ("slow", "[tests] full tier"),
)
"""scripts/test.sh's parts, each starting at the first traced command containing its marker (its ``echo``)."""
TIER_FILES = {"fast": ("", ".serial"), "slow": (".slow", ".slow.serial")}
"""The JUnit files of each tier, as suffixes of the ``--junitxml`` name (scripts/test.sh)."""
UNSET = (
    "VLMRL_VENV",
    "VLMRL_CACHE",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "PYTHON",
    "BASH_ENV",
    "SMOKE",
    "OUT",
    "RAY_ADDRESS",
    "VLMRL_DRY_RUN",
    "PYTHONHOME",
)
"""Environment variables of the calling shell the command does not inherit (they would change what it does)."""
SUMMARY_LINE = r"^=*\s*(\d+ (?:passed|failed|skipped|errors?|deselected)\b.*? in [\d.]+s\b.*?)\s*=*$"
"""pytest's last line (``-q`` drops the ``=`` around it)."""
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
GPU_ONLY = {
    "nvidia": lambda n: n.startswith("nvidia"),
    "cuda": lambda n: n.startswith(("cuda", "cuda_")),
    "triton": lambda n: n.startswith("triton"),
}
"""site-packages entries that only a GPU uses, by group (torch's CUDA libraries are counted in ``torch_cuda``)."""


def venv_sizes(venv: Path) -> dict[str, Any]:
    """Disk space of a virtual environment, and of its GPU-only parts by group."""
    site = next(venv.glob("lib/python3*/site-packages"), None)
    out: dict[str, Any] = {"venv_bytes": common.dir_bytes(venv)}
    groups: dict[str, int] = {k: 0 for k in GPU_ONLY}
    if site is not None:
        for entry in site.iterdir():
            for group, match in GPU_ONLY.items():
                if match(entry.name):
                    groups[group] += common.dir_bytes(entry) if entry.is_dir() else entry.lstat().st_blocks * 512
        lib = site / "torch" / "lib"
        groups["torch_cuda"] = sum(f.lstat().st_blocks * 512 for f in lib.glob("*cuda*")) if lib.is_dir() else 0
    out["gpu_only_bytes"] = groups
    out["gpu_only_total_bytes"] = sum(groups.values())
    return out


def tier_files(path: Path, tier: str) -> list[Path]:
    """The JUnit files a tier's runs wrote beside ``path`` (``NAME.xml``: scripts/test.sh's ``--junitxml``)."""
    return [p for p in (path.with_name(path.stem + sfx + ".xml") for sfx in TIER_FILES[tier]) if p.exists()]


def _cases(files: list[Path]) -> list[ET.Element]:
    return [c for p in files for c in ET.parse(p).getroot().iter("testcase")]


def junit(path: Path, tier: str | None = None) -> dict[str, Any]:
    """Counts from pytest's JUnit XML of one tier (``tier``) or both: tests, passed, failed, errors, skipped (and the
    skips naming CUDA or a GPU, with every skip's test and reason), pytest's time (the runs' sum) and the tests' own
    seconds (``test_s``: their sum, setup and teardown included)."""
    files = [f for t in ([tier] if tier else list(TIER_FILES)) for f in tier_files(path, t)]
    roots = [ET.parse(p).getroot() for p in files]
    suites = [s for root in roots for s in ([root] if root.tag == "testsuite" else list(root.iter("testsuite")))]
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    skips, failed = [], []
    for case in (c for root in roots for c in root.iter("testcase")):
        name = f"{case.get('classname')}::{case.get('name')}"
        for sk in case.findall("skipped"):
            skips.append({"test": name, "reason": sk.get("message", "")})
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
    gpu = [s for s in skips if re.search(r"CUDA|GPU", s["reason"])]
    return {
        "tests": total["tests"],
        "passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
        "failed": total["failures"],
        "errors": total["errors"],
        "skipped": total["skipped"],
        "skipped_gpu": len(gpu),
        "skips": skips,
        "failed_tests": failed,
        "pytest_s": sum(float(s.get("time", 0.0)) for s in suites),
        "test_s": sum(float(c.get("time", 0.0)) for root in roots for c in root.iter("testcase")),
    }


DURATIONS = common.ROOT / "tests" / "durations.json"
"""Each test's seconds in the last measured run, by node id: tests/test_suite_tiers.py checks the tiers against it,
and tests/conftest.py starts the parallel run with the heaviest modules."""


def node_id(case: ET.Element) -> str:
    """pytest's node id of a JUnit test case (``classname`` ``tests.test_x[.Class]``, ``name``)."""
    parts = case.get("classname", "").split(".")
    k = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    return "::".join(["/".join(parts[: k + 1]) + ".py", *parts[k + 1 :], case.get("name", "")])


SHARED_SETUP = "shared_setup_s"
"""The JUnit property tests/conftest.py gives a test: seconds of its setup spent on fixtures it shares with others."""


def shared_key(nodeid: str, tier: str) -> str:
    """The durations entry that holds a module's shared fixtures' seconds in one tier (no test has this id)."""
    return f"{nodeid.split('::')[0]}::(shared fixtures, {tier} tier)"


def write_durations(xml: Path, out: Path = DURATIONS) -> dict[str, float]:
    """``out``: each test's own seconds (setup, call and teardown, as JUnit counts them, less the setup of fixtures
    wider than one test, which the first test to use them pays) in the JUnit files of one run (``xml`` and the files
    of its other runs beside it), and per module and tier the shared fixtures' seconds (``shared_key``), slowest
    first."""
    seconds: dict[str, float] = {}
    for tier in TIER_FILES:
        for case in _cases(tier_files(xml, tier)):
            nid = node_id(case)
            shared = sum(float(p.get("value", 0.0)) for p in case.iter("property") if p.get("name") == SHARED_SETUP)
            seconds[nid] = seconds.get(nid, 0.0) + max(float(case.get("time", 0.0)) - shared, 0.0)
            if shared:
                key = shared_key(nid, tier)
                seconds[key] = seconds.get(key, 0.0) + shared
    ordered = dict(sorted(((n, round(t, 2)) for n, t in seconds.items()), key=lambda kv: (-kv[1], kv[0])))
    out.write_text(json.dumps(ordered, indent=1) + "\n")
    return ordered


def slowest(durations: dict[str, float], k: int = 10) -> list[list[Any]]:
    """The ``k`` slowest tests: ``[node id, seconds]``."""
    return [[n, s] for n, s in list(durations.items())[:k]]


def one_run(k: int, a: argparse.Namespace, commit: str) -> dict[str, Any]:
    """Clone HEAD into a new folder, run the test command there, measure; the clone is removed unless --keep."""
    a.work.mkdir(parents=True, exist_ok=True)
    parent = Path(tempfile.mkdtemp(prefix=f"suite-{k}-", dir=a.work))
    clone = parent / "vlmrl"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(common.ROOT), str(clone)], check=True)
    cloned = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if cloned != commit:
        raise RuntimeError(f"the clone is at {cloned}, not HEAD {commit} (a detached HEAD? check out a branch)")
    browser_before = next((b for b in BROWSERS if shutil.which(b)), None)
    venv_bin = os.environ.get("VIRTUAL_ENV")
    env = {key: v for key, v in os.environ.items() if key not in UNSET}
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (venv_bin and d.startswith(venv_bin))]
    path = [d for d in path if not d.startswith(str(common.ROOT / ".venv"))]
    env["PATH"] = os.pathsep.join(path)
    env["VLMRL_MEASURING_SUITE"] = "1"
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="vlmrl-bench-ray-")
    if a.no_pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    if a.quick:  # the checkout's installed .venv: the install check returns at once
        env["VLMRL_VENV"] = str(common.ROOT / ".venv")
    xml = parent / "junit.xml"
    trace = parent / "trace.txt"
    env = common.traced_env(env, trace)
    cmd = ["bash", "scripts/test.sh", *(["--all"] if a.tier == "all" else []), f"--junitxml={xml}", *a.pytest_args]
    log = a.work / f"run_{k}.log"
    run = common.run_locked(cmd, env=env, log=log, timeout_s=a.timeout_s, what=f"test suite run {k}", cwd=clone)
    text = log.read_text(errors="replace")
    if not xml.exists():
        raise RuntimeError(f"scripts/test.sh wrote no JUnit XML (exit {run['returncode']}); log {log}:\n{text[-4000:]}")
    parts = common.script_phases(trace, PARTS, run["started_epoch"], run["started_epoch"] + run["wall_s"])
    m = re.search(r"\[vlmrl install\] done in (\d+) s", text)
    summary = re.findall(SUMMARY_LINE, text, re.M)
    measured = None if (a.quick or a.pytest_args or a.tier != "all") else write_durations(xml)
    res: dict[str, Any] = {
        "run": k,
        "returncode": run["returncode"],
        "wall_s": run["wall_s"],
        "parts_s": parts,
        "install_reported_s": int(m.group(1)) if m else None,
        **junit(xml),
        "tiers": {t: {key: v for key, v in junit(xml, t).items() if key != "skips"} for t in TIER_FILES},
        "slowest_tests": slowest(measured) if measured else None,
        "pytest_summary": " + ".join(summary) if summary else None,  # each pytest run's last line, in order
        "browser_before": browser_before,
        "browser_after": next((b for b in BROWSERS if shutil.which(b)), None),
        **venv_sizes(clone / ".venv" if not a.quick else common.ROOT / ".venv"),
        "foreign_cpu_frac": run["foreign_cpu_frac"],
        "log": str(log),
    }
    if not a.keep:
        shutil.rmtree(parent, ignore_errors=True)
    return res


def markdown(res: dict[str, Any]) -> str:
    """The benchmarks/README.md section."""
    c = res["config"]
    command = c["command"]
    lines = [
        f"`python benchmarks/bench_suite.py --runs {c['runs']}{' --tier fast' if c.get('tier') == 'fast' else ''}` "
        f"({res['date']}). `git clone` of the repository at "
        f"{res['commit'][:10]}{' (the checkout had uncommitted changes, not measured)' if res['dirty'] else ''}, "
        f"then `{command}` in the clone as CI runs it: a new `.venv` (the first install), Chromium when none is "
        "installed, then the contributor tier (the tests not marked `slow`, as `bash scripts/test.sh` runs them) and "
        "the slow tier. Parts timed from the command's own steps (bash's `set -x` with timestamps, through "
        "`BASH_ENV`); counts and pytest's time from the JUnit XML.",
        "",
    ]
    header = [
        "run",
        "tests (contributor + slow)",
        "passed",
        "failed + errors",
        "skipped (GPU)",
        "command min",
        "install min",
        "contributor tier min",
        "slow tier min",
        ".venv GiB",
        "GPU-only GiB",
        "CPU used by others",
    ]
    rows = []
    for r in res["runs"]:
        p, t = r["parts_s"], r["tiers"]
        rows.append(
            [
                str(r["run"]),
                f"{r['tests']} ({t['fast']['tests']} + {t['slow']['tests']})",
                str(r["passed"]),
                str(r["failed"] + r["errors"]),
                f"{r['skipped']} ({r['skipped_gpu']})",
                f"{r['wall_s'] / 60:.1f}",
                f"{p.get('install', 0) / 60:.1f}",
                f"{p.get('fast', 0) / 60:.1f}",
                f"{p.get('slow', 0) / 60:.1f}",
                f"{r['venv_bytes'] / 2**30:.1f}",
                f"{r['gpu_only_total_bytes'] / 2**30:.1f}",
                f"{r['foreign_cpu_frac']:.0%}",
            ]
        )
    lines.append(common.table(header, rows))
    r0 = res["runs"][0]
    g = r0["gpu_only_bytes"]
    lines += [
        "",
        "GPU-only parts of the `.venv` (GiB): " + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in g.items()) + ".",
        f"Chromium before the run: {r0['browser_before'] or 'none'}; after: {r0['browser_after'] or 'none'}. "
        f"pytest's last lines: `{r0['pytest_summary']}`.",
    ]
    if r0.get("slowest_tests"):
        lines += [
            "",
            "Slowest tests (s, setup included): " + "; ".join(f"`{n}` {s:.0f}" for n, s in r0["slowest_tests"]) + ".",
        ]
    if r0["skips"]:
        lines += ["", "Skipped: " + "; ".join(f"`{s['test']}` ({s['reason']})" for s in r0["skips"]) + "."]
    if r0["failed_tests"]:
        lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in r0["failed_tests"]) + "."]
    lines += ["", common.machine_line(res), "Raw numbers: `benchmarks/results/suite.json`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Clone, run the test command ``--runs`` times, write the results and the README section."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--retries", type=int, default=1, help="repeat a run during which others used > 10%% of the CPU")
    p.add_argument(
        "--tier",
        choices=("all", "fast"),
        default="all",
        help="all: bash scripts/test.sh --all (both tiers); fast: the contributor tier alone",
    )
    p.add_argument("--quick", action="store_true", help="checkout's .venv, one test file; results only under --work")
    p.add_argument("--no-pip-cache", action="store_true", help="install without pip's download cache")
    p.add_argument("--keep", action="store_true", help="keep the clone (and its .venv, ~8 GB)")
    p.add_argument("--timeout-s", type=float, default=3 * 3600)
    p.add_argument("--work", type=Path, default=common.ROOT / ".cache" / "bench" / "suite")
    p.add_argument("--durations-from", type=Path, help="only write tests/durations.json from a kept run's junit.xml")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (changes what is measured)")
    a = p.parse_args(argv)
    if a.durations_from:
        return write_durations(a.durations_from)
    if a.quick and not a.pytest_args:
        a.pytest_args = ["tests/test_algos.py"]
    prov = common.provenance()  # the checkout as the clone is taken: what it measures
    commit, dirty = prov["commit"], prov["dirty"]
    if commit is None:
        raise SystemExit("bench_suite: run it from a git checkout (it clones HEAD)")
    if dirty:
        print("[bench_suite] the checkout has uncommitted changes: the clone measures HEAD without them", flush=True)
    n = 1 if a.quick else a.runs
    runs = []
    for k in range(1, n + 1):
        r = common.uncontended(lambda k=k: one_run(k, a, commit), f"test suite run {k}", a.retries)
        runs.append(r)
        print(
            f"[bench_suite] run {k}: {r['tests']} tests, {r['passed']} passed, {r['failed']} failed, "
            f"{r['errors']} errors, {r['skipped']} skipped; command {r['wall_s'] / 60:.1f} min, parts "
            f"{ {k2: round(v) for k2, v in r['parts_s'].items()} } s; .venv {r['venv_bytes'] / 2**30:.2f} GiB",
            flush=True,
        )
    keys = ("wall_s", "pytest_s", "tests", "passed", "failed", "skipped", "venv_bytes", "gpu_only_total_bytes")
    summary = {key: common.spread([r[key] for r in runs]) for key in keys}
    for part in PARTS:
        summary[f"parts_s/{part[0]}"] = common.spread([r["parts_s"].get(part[0]) for r in runs])
    for tier in TIER_FILES:
        summary[f"tests/{tier}"] = common.spread([r["tiers"][tier]["tests"] for r in runs])
    res = {
        **common.result_head("suite"),
        "commit": commit,  # (as the clone was taken, whatever the checkout is now)
        "dirty": dirty,
        "config": {
            "runs": n,
            "quick": a.quick,
            "pytest_args": a.pytest_args,
            "no_pip_cache": a.no_pip_cache,
            "tier": a.tier,
            "command": f"bash scripts/test.sh{' --all' if a.tier == 'all' else ''} --junitxml=...",
        },
        "runs": runs,
        "summary": summary,
    }
    common.publish("suite", SECTION, res, markdown(res), a.work if a.quick or a.pytest_args else None)
    return res


if __name__ == "__main__":
    main()
