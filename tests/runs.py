"""Training runs as a user launches them (``python -m vlmrl.train`` in a subprocess of its own session, with its own
Ray temp dir), shared by the end-to-end tests: every process a run started is ended afterwards, and only those."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

COLOUR_ARGS = [
    "--families",
    "colour",
    "--image-size",
    "112",
    "--train-size",
    "4096",
    "--test-size",
    "96",
    "--seed",
    "0",
    "--no-progress",
]
"""The quick start's data (examples/quickstart_cpu.sh)."""


def processes():  # noqa: ANN201 - a multiprocessing context
    """The multiprocessing context of a test's own worker processes (a world of FSDP ranks): the session's forkserver
    (tests/conftest.py), whose preload holds torch and transformers, so a process starts in milliseconds rather than
    importing them (``spawn``: ~10 s on 2 cores)."""
    import multiprocessing as mp

    return mp.get_context("forkserver")


def make_colour_data(out: Path) -> Path:
    """The quick start's data (``colour_data_dir``) copied into ``out``."""
    import shutil

    shutil.copytree(colour_data_dir(), out, dirs_exist_ok=True)
    return out


def colour_data_dir() -> Path:
    """The quick start's data, exactly as examples/quickstart_cpu.sh makes it (``preprocess/synthetic.py``; the
    quick start's own test compares the bytes): made once per version of the code that writes it (in $VLMRL_CACHE,
    atomically, so parallel test processes share it), not once per test (~15 s each). Read it, never write it: a run
    of the quick start script takes it as ``QUICKSTART_DATA``."""
    import hashlib

    from vlmrl.testing.tiny import cache_root, cached_build

    repo = Path(__file__).parents[1]
    code = [
        repo / "preprocess" / "synthetic.py",
        *sorted((repo / "vlmrl" / "preprocess").glob("*.py")),
        *sorted((repo / "vlmrl" / "data").glob("*.py")),
    ]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in code) + " ".join(COLOUR_ARGS).encode()).hexdigest()[:12]
    cached = cached_build(
        cache_root() / f"colour-data-{key}",
        "train.parquet",
        lambda tmp: subprocess.run(
            [sys.executable, "preprocess/synthetic.py", "--output-dir", str(tmp), *COLOUR_ARGS],
            check=True,
            capture_output=True,
            cwd=repo,
        ),
    )
    return Path(cached)


class Run:
    """A training subprocess and every process it spawns (Ray's included)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.ray_dir = tempfile.mkdtemp(prefix="vr", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vlmrl-run-", suffix=".log", delete=False)  # noqa: SIM115
        full_env = {**os.environ, "RAY_TMPDIR": self.ray_dir, **env, "PYTHONUNBUFFERED": "1"}  # env may name a cluster
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vlmrl.train", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            cwd=Path(__file__).parents[1],
        )
        self.seen: set[int] = set()

    def descendants(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen.update(k.pid for k in kids)
        return kids

    def workers(self) -> list[psutil.Process]:
        out = []
        for p in self.descendants():
            try:
                if "vlmrl-worker-" in " ".join(p.cmdline()):
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def wait_watching_listeners(self, timeout: float) -> tuple[int, set[int], set[tuple[str, int, str]]]:
        """:meth:`wait`, meanwhile reading every 0.2 s the listening TCP sockets of the driver and each process it
        started: (exit status, every pid seen, every (address, port, process name) that listened)."""
        pids: set[int] = set()
        seen: set[tuple[str, int, str]] = set()
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            now = {self.proc.pid} | {p.pid for p in self.descendants()}
            pids |= now
            seen |= listening(now)
            time.sleep(0.2)
        return self.wait(timeout=max(1.0, deadline - time.monotonic())), pids, seen

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            raise AssertionError(f"run did not finish within {timeout} s:\n{self.output()[-4000:]}") from None

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def cleanup(self) -> None:
        """End the driver and everything it started (only those processes)."""
        self.descendants()
        for pid in [self.proc.pid, *self.seen]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(timeout=30)


def listening(pids: set[int]) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of these processes."""
    out = set()
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                name = "?"
            out.add((c.laddr.ip, c.laddr.port, name))
    return out


def run_to_end(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> Run:
    """Run training to its end and end every process it started; asserts a zero exit status (showing the log's tail)."""
    run = Run(args, {**ENV, **(env or {})})
    try:
        rc = run.wait(timeout=timeout)
    finally:
        run.cleanup()
    assert rc == 0, run.output()[-4000:]
    return run


class HereRun:
    """A run :func:`run_here` made: what it printed."""

    def __init__(self, text: str) -> None:
        self.text = text

    def output(self) -> str:
        return self.text


def run_here(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> HereRun:
    """:func:`run_to_end`'s run with this test process as the driver: the launch command's code path
    (``vlmrl.train.main``, :func:`cli_here`) with its worker processes forked from the session's forkserver
    (tests/conftest.py), whose preload holds their imports. A new driver interpreter and its own forkserver import
    torch, transformers and vLLM again (about 40 s of a run's start on 2 cores busy with the other test process);
    here a run starts in a few seconds. For what a run does; how its processes start and end, and runs on Ray, are
    tested on subprocesses (:func:`run_to_end`, :class:`Run`). Asserts a zero exit status (showing the output's
    tail). Past ``timeout`` the processes the run started are ended, so the run stops naming the worker that
    died."""
    import threading

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}

    def expire() -> None:
        for p in me.children(recursive=True):
            if p.pid not in before:
                try:
                    p.kill()
                except psutil.Error:
                    pass

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        code, text, _ = cli_here(args, env={**ENV, **(env or {})}, merged=True)
    finally:
        timer.cancel()
    assert code == 0, f"exit status {code} (timeout {timeout} s):\n{text[-4000:]}"
    return HereRun(text)


EXAMPLE_VARS = ("SMOKE", "OUT", "CONFIG", "FAMILY", "MODEL_SIZE", "QUICKSTART_DATA", "VLMRL_DRY_RUN", "RAY_ADDRESS")
"""Variables of the caller's environment that would change what an example script does: ``run_example`` drops them."""


def run_example(script: str, out: Path, *overrides: str, timeout: float = 1200, **env: str) -> str:
    """``bash examples/<script> <overrides>`` as a user runs it (its own model, data and defaults; only ``OUT`` points
    at ``out``, and ``env`` adds variables), in its own session with its own Ray temp dir; asserts a zero exit status
    (showing the log's tail) and returns what it printed. Past ``timeout`` every process of its session ends."""
    repo = Path(__file__).parents[1]
    keep = {k: v for k, v in os.environ.items() if k not in EXAMPLE_VARS}
    full = {
        **keep,
        "OUT": str(out),
        "VLMRL_VENV": str(Path(sys.executable).parents[1]),
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="vr", dir="/tmp"),
        **ENV,
        **env,
    }
    cmd = ["bash", str(repo / "examples" / script), *overrides]
    proc = subprocess.Popen(
        cmd,
        cwd=out.parent,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise AssertionError(f"{script} did not finish within {timeout} s:\n{log[-5000:]}") from None
    finally:
        try:  # anything of the script's session still running
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    assert proc.returncode == 0, log[-5000:]
    return log


def cli_here(args: list[str], env: dict[str, str] | None = None, merged: bool = False) -> tuple[int, str, str]:
    """``python -m vlmrl.train ARGS`` (``vlmrl.train.main``: compose, check, then print, dry-run or train) run in this
    process, with ``env`` set for the call: (exit status, stdout, stderr; ``merged``: both in the order printed, as
    stdout). For what starts no worker process (a config error, ``trainer.dry_run=True``, ``--cfg job``,
    ``trainer.launcher=inline``): a new interpreter's imports (~15 s on 2 cores) are the most of such a call."""
    import contextlib
    import io

    from vlmrl.train import main

    out = io.StringIO()
    err = out if merged else io.StringIO()
    code = 0
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.getvalue(), "" if merged else err.getvalue()


def train_here(args: list[str]) -> tuple[int, str]:
    """The launch command's code path run in this process (:func:`cli_here`), for runs with
    ``trainer.launcher=inline`` (one worker, here). Returns the exit status and what the run printed."""
    assert "trainer.launcher=inline" in args, "a run that starts worker processes runs as a subprocess (run_to_end)"
    code, out, _ = cli_here(args, merged=True)
    return code, out


def train_here_to_end(args: list[str]) -> str:
    """``train_here`` that asserts a zero exit status (showing the output's tail); returns the output."""
    code, text = train_here(args)
    assert code == 0, text[-4000:]
    return text


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def wait_for_step(run: Run, run_dir: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.get("step", 0) >= step for r in metrics(run_dir)):
            return
        if run.proc.poll() is not None:
            raise AssertionError(f"run ended (rc {run.proc.returncode}) before step {step}:\n{run.output()[-4000:]}")
        time.sleep(0.02)
    run.cleanup()
    raise AssertionError(f"step {step} not reached within {timeout} s:\n{run.output()[-4000:]}")


def base_args(model: str, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config-name",
        "tiny_cpu",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
        *extra,
    ]


ENV = {"OMP_NUM_THREADS": "1"}
