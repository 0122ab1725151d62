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
