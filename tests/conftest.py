"""Shared fixtures: one cached tiny Qwen2.5-VL per seed, thread pinning, Ray/vLLM environment for tests, and the turn
that lets a test marked ``serial`` run alone when the suite runs in parallel."""

from __future__ import annotations

import fcntl
import glob
import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

# set before torch / vLLM / Ray are imported by any test module
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="vlmrl-ray-"))
# vLLM's cache where vLLM puts it for the real HOME (``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``), fixed here for
# the tests that give their commands a HOME of their own (verl's scripts read ``$HOME/data``): without it each of
# their engines misses vLLM's model-class cache (``modelinfos``) and inspects the class in a new interpreter that
# imports vLLM, about 18 s of each engine's start on 2 cores
os.environ.setdefault(
    "VLLM_CACHE_ROOT", os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from vlmrl.procs import lean_exit  # noqa: E402

lean_exit()  # each pytest process (xdist's workers too) ends without walking every object at exit (~2 s)

if os.environ.get("VLMRL_TEST_TIER"):  # scripts/test.sh: the heavy imports once per test process, at collection,
    # rather than in whichever test first needs them (each test's time decides its tier: tests/test_suite_tiers.py)
    import importlib

    from vlmrl.workers.launch_local import VLLM_MODULES, WORKER_MODULES

    # (not vLLM's for the contributor tier's serial tests: none of them starts an engine; measured, none took longer
    # without it and their pytest started ~8 s sooner)
    _serial_fast = os.environ.get("VLMRL_TEST_TIER") == "fast" and os.environ.get("VLMRL_TEST_PHASE") == "serial"
    # torch, transformers, vLLM, the trainer
    for _name in (*WORKER_MODULES, *(() if _serial_fast else VLLM_MODULES), "vlmrl.trainer.grpo"):
        importlib.import_module(_name)


@pytest.fixture(scope="session", autouse=True)
def shared_forkserver():
    """One forkserver for the whole session, preloaded as a rollout worker's is (its tool pool starts it) and with a
    CPU worker's imports (torch, transformers, the hybrid worker): the reward and tool pools of many tests and the
    tests' own worker processes (``runs.processes``) fork from it, and Python starts one forkserver per process,
    with the preload of the first pool that asks. Outside the contributor tier it preloads vLLM's engine modules
    too, for the runs whose driver is the test process (``runs.run_here``): their workers fork from it."""
    from vlmrl.workers.launch_local import start_forkserver

    start_forkserver(
        vllm=os.environ.get("VLMRL_TEST_TIER") != "fast",
        also=("vlmrl.tools.runner", "vlmrl.models.qwen_vl", "qwen_vl_utils.vision_process"),
    )
    yield


@pytest.fixture(scope="session")
def tiny_model_dir():
    """Path of the cached tiny Qwen2.5-VL (seed 0), built on first use."""
    from vlmrl.testing.tiny import ensure_tiny_model

    return str(ensure_tiny_model(seed=0))


@pytest.fixture(scope="session")
def tiny_processor(tiny_model_dir):
    """The tiny model's Qwen2_5_VLProcessor."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


# ------------------------------------------------------------------------------------------ parallel runs, serial tests
# ``bash scripts/test.sh`` runs the tests not marked ``serial`` in 2 processes (pytest-xdist), then the serial ones
# (a bound on elapsed time, a whole-machine process check, a multi-node cluster) in one (VLMRL_TEST_PHASE). Where a
# parallel run has both (``pytest -n 2`` by hand), a serial test still runs alone: it holds a lock file exclusively
# while every other test holds it shared, and while it waits its flag file (naming its pid) keeps new tests from
# starting.
_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
_LOCK = os.path.join(tempfile.gettempdir(), f"vlmrl-tests-{_RUN_ID}.lock")


def _serial_waiting() -> bool:
    """Whether a live process of this run waits for (or holds) the exclusive lock."""
    for flag in glob.glob(f"{_LOCK}.serial-*"):
        try:
            os.kill(int(flag.rsplit("-", 1)[1]), 0)
            return True
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            return True
    return False


@contextmanager
def _turn(serial: bool):
    """Hold this test's turn: exclusive for a ``serial`` test, shared otherwise (a no-op outside pytest-xdist)."""
    if not _RUN_ID:
        yield
        return
    flag = f"{_LOCK}.serial-{os.getpid()}"
    if serial:
        open(flag, "w").close()
    else:
        while _serial_waiting():
            time.sleep(0.1)
    fd = os.open(_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock
        if serial:
            os.remove(flag)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown of each test (its module fixtures' too) within its turn."""
    with _turn(item.get_closest_marker("serial") is not None):
        yield


def pytest_configure(config):
    """Each test's shared fixtures timed apart from it (tests/shared_setup.py; benchmarks/bench_suite.py reads it)."""
    import shared_setup

    if not config.pluginmanager.is_registered(shared_setup):
        config.pluginmanager.register(shared_setup, "vlmrl-shared-setup")


_DURATIONS = Path(__file__).parent / "durations.json"
"""Each test's seconds in the last measured run, by node id (``python benchmarks/bench_suite.py`` writes it): the
tiers are checked against it (tests/test_suite_tiers.py) and the parallel run starts with the heaviest modules."""
TIERS = ("fast", "slow")
"""``VLMRL_TEST_TIER``: ``fast`` (the contributor tier: every test not marked ``slow``) or ``slow`` (the rest of
``--all``); unset, both."""
SLOW_AFTER_S = 10.0
"""A test that took longer than this in the last measured run belongs to the ``slow`` tier."""
MARKS = pytest.StashKey[dict]()
"""Every collected test (before the tier and phase selection) -> whether it is marked ``slow``."""


def durations() -> dict[str, float]:
    """tests/durations.json: node id -> seconds in the last measured run (empty where none was measured)."""
    return json.loads(_DURATIONS.read_text()) if _DURATIONS.exists() else {}


def _may_hold_serial_tests(path: Path) -> bool:
    """Whether a test module's source mentions ``serial`` (any case): a module that does not holds no serial test."""
    return "serial" in path.read_text(encoding="utf-8").lower()


def pytest_ignore_collect(collection_path, config):
    """The serial phase (``VLMRL_TEST_PHASE=serial``) does not import the test modules that never mention ``serial``:
    they hold no serial test, and importing all ~90 modules to deselect them took ~8 s of each serial pytest's start.
    The other phases collect every module and check that rule (``pytest_collection_modifyitems``)."""
    p = Path(collection_path)
    if os.environ.get("VLMRL_TEST_PHASE") == "serial" and p.suffix == ".py" and p.name.startswith("test_"):
        return None if _may_hold_serial_tests(p) else True
    return None


def pytest_collection_modifyitems(config, items):
    """``VLMRL_TEST_TIER`` (scripts/test.sh) keeps the contributor tier (``fast``: the tests not marked ``slow``) or
    the rest (``slow``); ``VLMRL_TEST_PHASE`` keeps the tests not marked ``serial`` (``parallel``: the modules that
    took longest in the last measured run first, tests/durations.json) or only those (``serial``); ``gpu`` tests
    skip themselves where CUDA is absent (CI has none); with neither variable set everything runs."""
    config.stash[MARKS] = {i.nodeid: i.get_closest_marker("slow") is not None for i in items}
    hidden = sorted(
        {str(i.path) for i in items if i.get_closest_marker("serial") and not _may_hold_serial_tests(Path(i.path))}
    )
    if hidden:  # the serial phase would never import them (pytest_ignore_collect): their serial tests would not run
        raise pytest.UsageError(f"serial tests in modules whose source never says 'serial': {hidden}")
    tier = os.environ.get("VLMRL_TEST_TIER", "")
    phase = os.environ.get("VLMRL_TEST_PHASE", "")
    if tier and tier not in TIERS:
        raise pytest.UsageError(f"VLMRL_TEST_TIER={tier!r}: use fast or slow (or leave it unset)")
    if phase and phase not in ("parallel", "serial"):
        raise pytest.UsageError(f"VLMRL_TEST_PHASE={phase!r}: use parallel or serial (or leave it unset)")
    keep = [
        i
        for i in items
        if (not tier or (i.get_closest_marker("slow") is not None) == (tier == "slow"))
        and (not phase or (i.get_closest_marker("serial") is not None) == (phase == "serial"))
    ]
    if len(keep) < len(items):
        kept = {id(i) for i in keep}
        config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept])
        items[:] = keep
    if phase == "parallel":  # the heaviest modules first: the last tests to finish are short ones, no core idles long
        module_s: dict[str, float] = {}
        for nodeid, s in durations().items():
            module_s[nodeid.split("::")[0]] = module_s.get(nodeid.split("::")[0], 0.0) + s
        items.sort(key=lambda i: -module_s.get(i.nodeid.split("::")[0], 0.0))  # stable: a module's tests in order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (runs on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


START_AFTER = "VLMRL_TEST_START_AFTER"
"""A file whose appearance this pytest waits for after its collection, before its first test: scripts/test.sh starts
each tier's serial pytest beside the parallel one (its collection's imports use the time a core is idle there) and
creates the file when the parallel pytest ended, so the serial tests still run alone."""


def pytest_collection_finish(session):
    """Wait for ``VLMRL_TEST_START_AFTER``'s file, where set (scripts/test.sh's serial phase); a pytest whose parent
    ended meanwhile (the test command was stopped) stops too."""
    flag = os.environ.get(START_AFTER)
    if not flag:
        return
    parent = os.getppid()
    while not os.path.exists(flag):
        if os.getppid() != parent:
            pytest.exit("the test command that started this pytest ended before its turn", returncode=2)
        time.sleep(0.2)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """In the contributor tier, name the tests that took longer than ``SLOW_AFTER_S`` in this run: once measured
    (benchmarks/bench_suite.py), such a test fails tests/test_suite_tiers.py until it is faster or marked ``slow``."""
    if os.environ.get("VLMRL_TEST_TIER") != "fast":
        return
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():  # setup, call and teardown, as the JUnit file counts them
        for r in reports:
            if getattr(r, "when", None) in ("setup", "call", "teardown"):
                took[r.nodeid] = took.get(r.nodeid, 0.0) + r.duration
    over = sorted(((s, nodeid) for nodeid, s in took.items() if s > SLOW_AFTER_S), reverse=True)
    if over:
        terminalreporter.write_sep("-", f"contributor-tier tests over {SLOW_AFTER_S:.0f} s in this run")
        for s, nodeid in over:
            terminalreporter.write_line(f"{s:7.1f} s  {nodeid}  (make it faster or mark it slow)")
