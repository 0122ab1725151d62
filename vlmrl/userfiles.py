"""Importing the Python files a launcher names (reward functions, advantage estimators, policy losses): the one loader.

A file ``/some/dir/my_reward.py`` is imported as ``vlmrl.userfiles.d<hash of /some/dir>.my_reward``: a real, dotted
module name inside a package whose ``__path__`` is the file's folder. So, unlike a module made with
``spec_from_file_location`` under a private name,

* the file's functions pickle by reference and unpickle in child processes (a ``spawn`` process pool started by the
  reward itself, as verl's ``math_verify.py`` does; vlmrl's reward workers): the folder map travels in the
  environment (``VLMRL_USER_DIRS``), which children inherit, and this module's finder resolves the name there;
* relative imports between files of one folder work (verl's ``math_batch.py``: ``from .math_reward import ...``);
* its folder is also appended to ``sys.path``, so ``import helper`` of a file beside it works as before.

Only paths given by the person launching the run reach this module: nothing in a dataset or checkpoint names a file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__path__: list[str] = []  # a package: the per-folder packages below are found by ``_Finder``

ENV = "VLMRL_USER_DIRS"
"""Environment variable holding ``{"d<hash>": folder}`` for every folder a user file was imported from."""


def _dirs() -> dict[str, str]:
    try:
        value = json.loads(os.environ.get(ENV) or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class _Finder(importlib.abc.MetaPathFinder):
    """Resolves ``vlmrl.userfiles.d<hash>`` to a package whose ``__path__`` is the registered folder."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        head, _, tail = fullname.rpartition(".")
        if head != __name__:
            return None
        folder = _dirs().get(tail)
        if not folder or not os.path.isdir(folder):
            return None
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = [folder]
        return spec


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())


def module_name(path: str | os.PathLike) -> str:
    """The dotted name the file at ``path`` is imported under (registering its folder)."""
    full = Path(path).expanduser().resolve()
    key = "d" + hashlib.sha1(str(full.parent).encode()).hexdigest()[:12]
    dirs = _dirs()
    if dirs.get(key) != str(full.parent):
        dirs[key] = str(full.parent)
        os.environ[ENV] = json.dumps(dirs)
    return f"{__name__}.{key}.{full.stem}"


def import_file(path: str | os.PathLike) -> Any:
    """Import the Python file at ``path`` once per process (see the module docstring) and return the module.

    Raises FileNotFoundError for a path that is not a file and ValueError for a name Python cannot import
    (a file stem holding a dot)."""
    full = Path(path).expanduser()
    if not full.is_file():
        raise FileNotFoundError(f"file not found: '{path}' (resolved to '{full.resolve()}', cwd '{os.getcwd()}')")
    if full.suffix != ".py" or "." in full.stem:
        raise ValueError(f"'{path}': expected a Python file named like name.py")
    folder = str(full.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    name = module_name(full)
    try:
        return importlib.import_module(name)
    except BaseException:
        sys.modules.pop(name, None)
        raise


def load_function(path: str | os.PathLike, name: str) -> Callable[..., Any]:
    """``name`` from the Python file at ``path``; AttributeError listing the file's functions when it has none."""
    return _attr(import_file(path), name, f"'{path}'")


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split ``file.py:fn`` / ``module:fn`` into (target, fn name); a bare name or ``file.py`` gives (spec, None)."""
    head, sep, tail = spec.rpartition(":")
    # a Windows drive letter ("C:\\x.py") is not a separator
    if sep and head and len(head) > 1 and tail and "/" not in tail and "\\" not in tail:
        return head, tail
    return spec, None


def short_name(spec: str) -> str:
    """A function spec's short name, without loading it: the function's (``file.py:fn`` and ``module:fn`` -> fn),
    ``compute_score`` for a bare ``file.py`` (verl's default), else the spec itself (a registry name). A reward
    component's default name and its metrics' key."""
    target, fn_name = split_spec(spec)
    if fn_name:
        return fn_name
    return "compute_score" if target.endswith(".py") else spec


def is_file_target(target: str) -> bool:
    """True when a spec's target names a file (``x.py`` or a path) rather than an importable module."""
    return target.endswith(".py") or "/" in target or os.sep in target


def load_callable(spec: str, what: str = "function", default_name: str | None = None) -> Callable[..., Any]:
    """The one way a launcher's ``path/to/file.py:fn`` or ``package.module:fn`` becomes a function (rewards,
    advantage estimators, policy losses). ``what`` (the config key) is named in every error; ``default_name`` is
    used when the spec names no function.

    Only the person launching the run names these (a command-line or config value): nothing in a dataset can.
    Raises FileNotFoundError (no such file), ValueError (no function named, or a file Python cannot import),
    AttributeError (no such function: the module's functions are listed) and ModuleNotFoundError.
    """
    target, name = split_spec(spec)
    name = name or default_name
    if name is None:
        raise ValueError(f"{what}={spec!r}: expected 'path/to/file.py:function' or 'package.module:function'")
    if is_file_target(target):
        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"{what} file '{target}' does not exist (resolved to '{path.resolve()}', cwd '{os.getcwd()}')"
            )
        try:
            module = import_file(path)
        except ValueError as e:
            raise ValueError(f"{what}: cannot import {e}") from None
    else:
        module = importlib.import_module(target)
    return _attr(module, name, f"{what}: '{target}'")


def registered_or_file(
    registry: dict[str, Callable[..., Any]], name: str, what: str, choices: list[str]
) -> Callable[..., Any]:
    """A function by its registered name, or ``path/to/file.py:fn`` / ``package.module:fn``; ValueError naming the
    config key ``what`` and the ``choices`` otherwise (the advantage-estimator and policy-loss registries)."""
    if name in registry:
        return registry[name]
    if ":" in name:
        return load_callable(name, what=what)
    raise ValueError(f"{what}={name!r}: unknown; choose one of {sorted(choices)} or path/file.py:fn")


def _attr(module: Any, name: str, where: str) -> Callable[..., Any]:
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        public = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"{where} has no function '{name}' (it has: {', '.join(public[:20])})")
    return fn
