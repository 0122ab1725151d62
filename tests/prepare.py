"""Build what many tests share, once, before the suite runs (scripts/test.sh calls it; ``python tests/prepare.py``):
the tiny model of each family and the tool-demo one, the quick start's data and verl's preprocessed Geometry3K
stand-in, all cached in ``$VLMRL_CACHE`` as the tests' own calls would cache them (the same functions). Without it
the first test to ask builds each, while the other test process may build it too; and the tier check would measure
a build as that test's time.

Two processes share the builds (a machine of 2 cores). Prints what it built and the seconds.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _models() -> str:
    from vlmrl.testing.tiny import FAMILY_SPECS, TOOL_DEMO, ensure_tiny_model

    for spec in (*FAMILY_SPECS.values(), TOOL_DEMO):
        ensure_tiny_model(0, spec)
    return f"tiny models ({', '.join(FAMILY_SPECS)}, tool demo)"


def _data() -> str:
    import tempfile

    from utils import cached_verl_home

    from runs import make_colour_data

    with tempfile.TemporaryDirectory() as tmp:
        make_colour_data(Path(tmp) / "colour")
    cached_verl_home()
    return "the quick start's data, verl's Geometry3K stand-in"


def _timed(job):  # noqa: ANN001, ANN202 - a job of this module
    t0 = time.perf_counter()
    what = job()
    return what, time.perf_counter() - t0


def main() -> int:
    """Build everything in two processes; a failed build raises (its traceback printed, exit status 1)."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # the builders' progress bars
    t0 = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        for what, seconds in pool.map(_timed, (_models, _data)):
            print(f"[tests] prepared {what} in {seconds:.0f} s", flush=True)
    print(f"[tests] prepared the shared builds in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
