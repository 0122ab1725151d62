"""Every results file records what it measured: the date, the commit, whether the checkout had uncommitted changes,
the command and the machine (benchmarks/common.py's ``result_head``); the writer refuses a result without them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import common  # noqa: E402


def test_a_result_head_records_commit_dirty_command_and_machine() -> None:
    head = common.result_head("example")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert head["commit"] == commit.strip() and isinstance(head["dirty"], bool)
    assert head["command"].startswith("python ") and head["machine"]["cpu"]
    assert common.provenance_problems(head) == []
    mine = common.provenance(ROOT, ["benchmarks/bench_quickstart.py", "--runs", "3"])
    assert mine["command"] == "python benchmarks/bench_quickstart.py --runs 3"


def test_the_writer_refuses_a_result_that_does_not_say_what_it_measured(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    good = common.result_head("example") | {"value": 1.0}
    assert json.loads(common.write_result("example", good).read_text())["value"] == 1.0
    for key in ("commit", "dirty", "command", "date"):
        bad = {k: v for k, v in good.items() if k != key}
        with pytest.raises(ValueError, match=rf"example.json not written: the result does not record {key}"):
            common.write_result("example", bad)
    with pytest.raises(ValueError, match="machine.cpu"):
        common.write_result("example", good | {"machine": {"cpu": ""}})
    monkeypatch.delenv("VLMRL_BENCH_COMMIT", raising=False)
    outside = common.provenance(tmp_path, ["x.py"])  # no git checkout there: nothing to record, nothing written
    assert outside["commit"] is None and outside["dirty"] is None
    with pytest.raises(ValueError, match="commit, dirty"):
        common.write_result("example", good | outside)
    # a copy of the tree whose .git is absent or stale (the device machine's): its caller names the commit it copied
    monkeypatch.setenv("VLMRL_BENCH_COMMIT", "f" * 40)
    monkeypatch.setenv("VLMRL_BENCH_DIRTY", "0")
    copied = common.provenance(tmp_path, ["x.py"])
    assert copied["commit"] == "f" * 40 and copied["dirty"] is False
    monkeypatch.delenv("VLMRL_BENCH_DIRTY")
    assert common.provenance(tmp_path, ["x.py"])["dirty"] is True  # not said clean: counted dirty
    assert common.provenance(ROOT, ["x.py"])["commit"] == "f" * 40  # the caller's word wins over a stale .git


def test_every_committed_results_file_carries_its_commit_and_machine() -> None:
    """Issue 43: each results file names the machine (CPU model and cores) and the date, and the commit it was
    measured at (``commit``, with ``dirty`` and ``command``) or, for a file written before the writer recorded it,
    the commit that committed it (``committed_in``); ``benchmarks/provenance.py`` describes each."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import provenance

    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert (data.get("date") or data.get("when")) and (data.get("machine") or {}).get("cpu"), path.name
        if data.get("commit"):  # (suite.json before the writer recorded "command" kept it in its config)
            command = data.get("command") or (data.get("config") or {}).get("command")
            assert data.get("dirty") is not None and command, path.name
        else:
            assert len(data.get("committed_in") or "") == 40, f"{path.name}: neither commit nor committed_in"
        p = provenance.of(path.name)
        assert p["commit"] and p["command"] and "CPU cores" in provenance.describe(p), path.name
