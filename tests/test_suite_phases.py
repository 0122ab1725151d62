"""scripts/test.sh's two runs: the tests not marked ``serial`` in parallel, then the serial ones; together, every test
once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _collected(phase: str | None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "VLMRL_TEST_PHASE"}
    if phase is not None:
        env["VLMRL_TEST_PHASE"] = phase
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_config.py"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == (4 if phase == "nope" else 0), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_the_two_runs_split_the_suite_by_the_serial_mark() -> None:
    everything, parallel, serial = _collected(None), _collected("parallel"), _collected("serial")
    assert parallel | serial == everything and not parallel & serial
    src = (ROOT / "tests" / "test_config.py").read_text()
    assert len(serial) == src.count("@pytest.mark.serial") > 0 and len(parallel) > len(serial)
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'VLMRL_TEST_PHASE=parallel "${pytest[@]}" -n "$procs"' in script
    assert 'VLMRL_TEST_PHASE=serial "${pytest[@]}" ${serial_args[@]+"${serial_args[@]}"}' in script


def test_an_unknown_phase_is_a_usage_error() -> None:
    _collected("nope")
