"""Small shared helpers."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_callable(spec: str, what: str = "function", default_name: str | None = None) -> Callable[..., Any]:
    """Load ``path/to/file.py:fn`` (or ``package.module:fn``), the way users name their own rewards and algorithms.

    Only the person launching the run names these (a command-line or config value): nothing in a dataset can.
    """
    if ":" in spec:
        target, name = spec.rsplit(":", 1)
    elif default_name is not None:
        target, name = spec, default_name
    else:
        raise ValueError(f"{what}={spec!r}: expected 'path/to/file.py:function' or 'package.module:function'")
    if target.endswith(".py") or "/" in target:
        from vlmrl import userfiles

        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{what}: file {str(path)!r} does not exist (cwd: {Path.cwd()})")
        module = userfiles.import_file(path)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, name, None)
    if not callable(fn):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"{what}: {target!r} has no function {name!r} (it has: {', '.join(public[:20])})")
    return fn
