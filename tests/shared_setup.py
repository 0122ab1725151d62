"""A pytest plugin (tests/conftest.py registers it): the seconds of a test's setup spent building fixtures wider than
one test (module, class, package or session scope) go into its ``shared_setup_s`` property, which the JUnit file
carries. The first test to use such a fixture pays for every test that shares it; benchmarks/bench_suite.py charges
those seconds to the module instead, so that a test's own duration (tests/durations.json, the tiers' measure) does not
depend on which test of its module happened to run first."""

from __future__ import annotations

import time

import pytest

SHARED_SETUP = "shared_setup_s"
"""The property's name (benchmarks/bench_suite.py reads it)."""
_current: list = []
"""The test being run, to which a shared fixture's setup is reported."""


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Remember the test whose setup, call and teardown are running."""
    _current[:] = [item]
    try:
        yield
    finally:
        _current.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Time a fixture's setup; a shared one's seconds go to the current test's ``SHARED_SETUP`` property."""
    start = time.perf_counter()
    yield
    if fixturedef.scope == "function" or not _current:
        return
    props, spent = _current[0].user_properties, time.perf_counter() - start
    for i, (name, value) in enumerate(props):
        if name == SHARED_SETUP:
            props[i] = (name, round(float(value) + spent, 3))
            return
    props.append((SHARED_SETUP, round(spent, 3)))
