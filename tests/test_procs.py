"""Process lifetime helpers (``vlmrl.procs``): a command's process skips the interpreter's last garbage collection."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = (
    "vlmrl.train",
    "vlmrl.cli",
    "vlmrl.report",
    "vlmrl.trainer.tracking",
    "vlmrl.export",
    "vlmrl.run_verl",
    "vlmrl.testing.smoke",
    "vlmrl.testing.warm_start",
    "vlmrl.testing.tiny",
    "vlmrl.reward_model.train",
    "vlmrl.reward_model.train_judge",
    "vlmrl.preprocess.synthetic",
    "vlmrl.preprocess.jsonl",
    "vlmrl.preprocess.geo3k",
)


def test_lean_exit_freezes_after_every_other_exit_handler_and_keeps_what_was_written(tmp_path: Path) -> None:
    """``lean_exit()`` (twice: idempotent) registers ``gc.freeze`` to run after the exit handlers registered later
    and before those registered earlier (last-in first-out); a file a module left open is still flushed and closed
    at exit, and a handler's own output still appears."""
    left_open = tmp_path / "left_open.txt"
    code = textwrap.dedent(
        f"""
        import atexit, gc
        atexit.register(lambda: print("before lean_exit's handler: frozen", gc.get_freeze_count() > 0, flush=True))
        from vlmrl.procs import lean_exit
        lean_exit()
        lean_exit()
        atexit.register(lambda: print("after it: frozen", gc.get_freeze_count() > 0, flush=True))
        f = open({str(left_open)!r}, "w")
        f.write("kept")
        cycle = []
        cycle.append(cycle)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.splitlines() == ["after it: frozen False", "before lean_exit's handler: frozen True"], out
    assert left_open.read_text() == "kept"


@pytest.mark.slow  # imports torch and transformers as the commands do (~11 s)
def test_every_command_line_entry_point_exits_lean() -> None:
    """Each ``python -m`` command (and the ``vlmrl`` / ``vlmrl-train`` scripts' mains, run as the command line runs
    them) registers ``lean_exit`` before its work: run here with ``--help``, which each answers and exits."""
    code = textwrap.dedent(
        f"""
        import runpy, sys
        import vlmrl.procs as procs
        missing = []
        for name in {COMMANDS!r}:
            procs._LEAN_EXIT = False
            sys.argv = [name, "--help"]
            try:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            except SystemExit:
                pass
            if not procs._LEAN_EXIT:
                missing.append(name)
        print("missing", missing)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )
    assert "missing []" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def _huge_page_kb(q) -> None:  # noqa: ANN001 - a multiprocessing queue
    """A worker-side allocation the size of a decoder layer's gathered weights (64 MB, touched), and the process's
    memory on transparent huge pages."""
    import re

    import torch

    t = torch.ones(64 * 2**20 // 4)
    smaps = Path("/proc/self/smaps_rollup").read_text()
    q.put((float(t.sum()), int(re.search(r"AnonHugePages:\s+(\d+) kB", smaps).group(1))))


def test_cpu_workers_put_large_tensors_on_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU workers start with torch's CPU allocator putting tensors of 2 MB or more on transparent huge pages
    (``THP_MEM_ALLOC_ENABLE=1``; a value the caller sets is kept; GPU workers get none), and it takes effect: a
    process forked from the forkserver the CPU workers fork from (the session's, started with ``worker_env``) holds a
    64 MB tensor on huge pages where the kernel lends them (``transparent_hugepage`` not ``never``)."""
    from runs import processes
    from vlmrl.workers.group import HUGE_PAGES, worker_env

    monkeypatch.delenv(HUGE_PAGES, raising=False)
    assert worker_env("cpu")[HUGE_PAGES] == "1" and HUGE_PAGES not in worker_env("cuda")
    monkeypatch.setenv(HUGE_PAGES, "0")
    assert worker_env("cpu")[HUGE_PAGES] == "0"
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        return  # the kernel lends none: nothing more to see
    ctx = processes()
    q = ctx.Queue()
    p = ctx.Process(target=_huge_page_kb, args=(q,))
    p.start()
    total, huge_kb = q.get(timeout=60)
    p.join(30)
    assert total == 64 * 2**20 // 4 and huge_kb >= 32 * 1024, huge_kb
