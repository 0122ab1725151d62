"""The suite's two tiers, decided by measurement: ``bash scripts/test.sh`` runs the contributor tier (every test not
marked ``slow``) within 10 minutes on 2 cores, ``--all`` adds the slow tier, everything within 40. Each test's
seconds in the last measured run (``tests/durations.json``, written by ``python benchmarks/bench_suite.py`` from a
clean clone's run of ``bash scripts/test.sh --all``) decide: a test over 10 s belongs to the slow tier. Also the
split itself: scripts/test.sh's runs (tier x serial or not) cover every test once."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import MARKS, SLOW_AFTER_S, durations, pytest_collection_modifyitems, pytest_ignore_collect

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "benchmarks" / "results" / "suite.json"
CONTRIBUTOR_BUDGET_S = 600
"""The contributor tier's pytest runs (parallel and serial), measured on a clean clone."""
ALL_BUDGET_S = 2400
"""Both tiers' pytest runs."""
SLOWEST_S = 300
"""No single test (setup included) over this."""
SHARE = 0.8
"""The contributor tier holds at least this share of the suite's tests."""
CONTRIBUTOR_RUN = "tests/test_examples.py::test_the_quick_start_runs_end_to_end_in_smoke_mode"
"""The contributor tier's one end-to-end run (the quick start in smoke mode, ~30 s): the one test of the tier allowed
over 10 s."""


def _last_run() -> dict:
    return json.loads(SUITE.read_text())["runs"][-1]


# ------------------------------------------------------------------------------------------------ the split


class _Item:
    """What the selection reads of a collected test."""

    def __init__(self, nodeid: str, *marks: str, path: Path = Path(__file__)) -> None:
        self.nodeid, self.marks, self.path = nodeid, set(marks), path
        self.keywords = set(marks)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def _select(monkeypatch: pytest.MonkeyPatch, tier: str | None, phase: str | None, items: list[_Item]) -> list[str]:
    for var, value in (("VLMRL_TEST_TIER", tier), ("VLMRL_TEST_PHASE", phase)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    deselected: list = []
    config = SimpleNamespace(stash={}, hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    kept = list(items)
    pytest_collection_modifyitems(config, kept)
    assert {i.nodeid for i in kept} | {i.nodeid for i in deselected} == {i.nodeid for i in items}
    assert config.stash[MARKS] == {i.nodeid: "slow" in i.marks for i in items}
    return sorted(i.nodeid for i in kept)


def test_the_runs_of_scripts_test_sh_cover_every_test_once(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [
        _Item("a.py::fast"),
        _Item("a.py::serial", "serial"),
        _Item("b.py::slow", "slow"),
        _Item("b.py::slow_serial", "slow", "serial"),
    ]
    runs = {(t, p): _select(monkeypatch, t, p, items) for t in ("fast", "slow") for p in ("parallel", "serial")}
    assert runs == {
        ("fast", "parallel"): ["a.py::fast"],
        ("fast", "serial"): ["a.py::serial"],
        ("slow", "parallel"): ["b.py::slow"],
        ("slow", "serial"): ["b.py::slow_serial"],
    }
    assert _select(monkeypatch, "fast", None, items) == ["a.py::fast", "a.py::serial"]
    assert _select(monkeypatch, None, None, items) == sorted(i.nodeid for i in items)
    for var, bad in (("VLMRL_TEST_TIER", "all"), ("VLMRL_TEST_PHASE", "nope")):
        monkeypatch.setenv(var, bad)
        with pytest.raises(pytest.UsageError, match=var):
            pytest_collection_modifyitems(SimpleNamespace(stash={}), list(items))
        monkeypatch.delenv(var)


def test_the_serial_phase_skips_modules_without_serial_tests_and_the_others_check_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``VLMRL_TEST_PHASE=serial`` does not import a test module whose source never says "serial" (any case); a
    serial test in such a module (its mark applied from elsewhere) stops the other phases' collection, naming it, so
    no serial test is left out unnoticed."""
    plain, marked = tmp_path / "test_plain.py", tmp_path / "test_marked.py"
    plain.write_text("def test_a():\n    pass\n")
    marked.write_text("import pytest\n\n\n@pytest.mark.SERIAL_ALIAS\ndef test_b():\n    pass\n")
    monkeypatch.setenv("VLMRL_TEST_PHASE", "serial")
    assert pytest_ignore_collect(plain, None) is True
    assert pytest_ignore_collect(marked, None) is None and pytest_ignore_collect(tmp_path / "helper.py", None) is None
    monkeypatch.setenv("VLMRL_TEST_PHASE", "parallel")
    assert pytest_ignore_collect(plain, None) is None
    items = [_Item("test_plain.py::test_a", "serial", path=plain)]
    with pytest.raises(pytest.UsageError, match="never says 'serial'.*test_plain.py"):
        _select(monkeypatch, "fast", "parallel", items)


def test_the_test_command_runs_the_contributor_tier_and_all_runs_both() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r'if \[ "\$\{1:-\}" = "--all" \]; then\s+tiers=\(fast slow\)', script)
    assert "tiers=(fast)\n" in script
    assert 'VLMRL_TEST_TIER=$tier VLMRL_TEST_PHASE=parallel "${pytest[@]}" -n "$procs"' in script
    serial = 'VLMRL_TEST_TIER=$tier VLMRL_TEST_PHASE=serial VLMRL_TEST_START_AFTER="$turn/go" "${pytest[@]}"'
    assert serial in script
    # the serial pytest starts (in the background) before the parallel one, its turn comes after it
    order = [serial, "serial=$!", "VLMRL_TEST_PHASE=parallel", 'touch "$turn/go"', 'wait "$serial"']
    assert [script.index(s) for s in order] == sorted(script.index(s) for s in order)
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("bash scripts/test.sh --all")


def test_the_serial_pytest_waits_for_its_turn_and_stops_with_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``VLMRL_TEST_START_AFTER``: after its collection the serial pytest waits for the file scripts/test.sh creates
    when the parallel pytest ended, and stops (exit status 2) if the command that started it ended first; unset, it
    does not wait."""
    import os
    import threading
    import time

    from conftest import START_AFTER, pytest_collection_finish

    flag = tmp_path / "go"
    monkeypatch.setenv(START_AFTER, str(flag))
    t0 = time.monotonic()
    threading.Timer(0.6, flag.touch).start()
    pytest_collection_finish(None)
    assert flag.exists() and time.monotonic() - t0 >= 0.6
    flag.unlink()
    parents = iter([os.getppid(), os.getppid(), 1])
    monkeypatch.setattr(os, "getppid", lambda: next(parents, 1))
    with pytest.raises(pytest.exit.Exception) as stopped:
        pytest_collection_finish(None)
    assert stopped.value.returncode == 2 and "ended before its turn" in str(stopped.value)
    monkeypatch.delenv(START_AFTER)
    t0 = time.monotonic()
    pytest_collection_finish(None)
    assert time.monotonic() - t0 < 0.1


# ------------------------------------------------------------------------------------------- the measurement


def test_no_test_outside_the_slow_tier_took_longer_than_10_s(request: pytest.FixtureRequest) -> None:
    """Measured: a test over 10 s of its own in the last run (setup and teardown included, but the fixtures it shares
    with other tests, which its module's entry holds) is marked ``slow`` (or made faster), but the quick start's
    smoke run. Tests not measured yet are left to the next measurement (the contributor tier's run names them)."""
    marks = request.config.stash[MARKS]
    took = durations()
    assert took, "tests/durations.json is missing: python benchmarks/bench_suite.py writes it"
    over = {n: s for n, s in took.items() if s > SLOW_AFTER_S and n in marks and not marks[n] and n != CONTRIBUTOR_RUN}
    if CONTRIBUTOR_RUN in marks:  # collected (the whole suite, or test_examples.py with this file)
        assert marks[CONTRIBUTOR_RUN] is False, "the quick start's smoke run is the contributor tier's end-to-end run"
    assert not over, "over 10 s in the last measured run, not marked slow: " + json.dumps(over, indent=1)


def test_the_tiers_fit_their_budgets_on_a_clean_clone() -> None:
    """benchmarks/results/suite.json, the last clean-clone run of ``bash scripts/test.sh --all``: the contributor
    tier's pytest runs within 10 minutes, both within 40, the contributor tier at least 80 % of the tests, and every
    test passed but this file's own: run in that measurement, they judged the measurement before it (the committed
    tests/durations.json and suite.json of the time), which this one replaces; they judge this one here."""
    run = _last_run()
    parts, tiers = run["parts_s"], run["tiers"]
    assert parts["fast"] <= CONTRIBUTOR_BUDGET_S, parts
    assert parts["fast"] + parts["slow"] <= ALL_BUDGET_S, parts
    assert tiers["fast"]["tests"] >= SHARE * (tiers["fast"]["tests"] + tiers["slow"]["tests"]), tiers
    others = [t for t in run["failed_tests"] if not t.startswith("tests.test_suite_tiers::")]
    assert not others and run["errors"] == 0, run["failed_tests"]


def test_the_contributor_tier_as_marked_now_fits_its_budget(request: pytest.FixtureRequest) -> None:
    """The tests now outside the slow tier, at their measured seconds, on 2 processes, plus the measured run's own
    overhead (collection, start-up, the serial tests' turn, the last test's tail): within 10 minutes, so that moving
    a test into the contributor tier cannot take it over the budget unnoticed."""
    marks = request.config.stash[MARKS]
    took, run = durations(), _last_run()
    shared = sum(s for n, s in took.items() if n.endswith("(shared fixtures, fast tier)"))
    now_fast = shared + sum(s for n, s in took.items() if n in marks and not marks[n])
    overhead = run["parts_s"]["fast"] - run["tiers"]["fast"]["test_s"] / 2
    assert now_fast / 2 + max(overhead, 0.0) <= CONTRIBUTOR_BUDGET_S, (now_fast, overhead)


def test_no_test_takes_more_than_300_s_and_the_timeout_leaves_twice_the_slowest() -> None:
    took = durations()
    slowest = max(took.values())
    assert slowest <= SLOWEST_S, sorted(took.items(), key=lambda kv: -kv[1])[:5]
    timeout = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]
    assert timeout >= 2 * slowest and timeout >= 2 * SLOWEST_S, (timeout, slowest)


def test_a_shared_fixture_is_charged_to_its_module_not_to_the_first_test(tmp_path: Path) -> None:
    """A module fixture that takes 0.6 s and two tests that use it: the JUnit file gives the first test the 0.6 s
    (pytest counts a fixture's setup in the test that first needs it); tests/shared_setup.py records it as that
    test's shared setup, and the durations benchmarks/bench_suite.py writes give both tests their own time only and
    the module's shared-fixtures entry the 0.6 s."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_suite

    (tmp_path / "test_m.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture(scope='module')\n"
        "def slow():\n    time.sleep(0.6)\n    return 1\n"
        "@pytest.fixture\n"
        "def own():\n    time.sleep(0.3)\n    return 1\n"
        "def test_a(slow, own):\n    assert slow == own\n"
        "def test_b(slow):\n    assert slow\n"
    )
    xml = tmp_path / "junit.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "shared_setup",
            f"--junitxml={xml}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_m.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    took = bench_suite.write_durations(xml, tmp_path / "durations.json")
    a, b = took["test_m.py::test_a"], took["test_m.py::test_b"]
    assert 0.3 <= a < 0.55 and b < 0.25, took  # test_a keeps its own function fixture's 0.3 s
    assert took["test_m.py::(shared fixtures, fast tier)"] >= 0.6, took
