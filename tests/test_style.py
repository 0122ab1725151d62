"""The code stays ruff-clean (the developers' habit, now checked in CI): ``ruff check`` (the rules of
``[tool.ruff.lint]`` in pyproject.toml) and ``ruff format --check`` over the checkout pass, as a contributor runs them
before a commit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_the_checkout_is_ruff_clean(command: list[str]) -> None:
    """Every lint rule holds and every file is formatted; a failure prints ruff's own report (file, line, rule)."""
    ruff = Path(sys.executable).with_name("ruff")
    exe = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
    r = subprocess.run([*exe, *command, "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        f"ruff {' '.join(command)} found problems (fix them: ruff {command[0]} .):\n{r.stdout}{r.stderr}"
    )
