"""A run's start, step by step: each step says what it does and what to check when it fails.

    with stage("could not load the model from X", "check actor_rollout_ref.model.path"):
        model = load(...)

An exception leaving a stage becomes a :class:`StartupError` carrying a :class:`StartupFailure`: what failed, its
cause on one line, what to check, and the traceback (for the log file). A failure that already carries one (a
worker's, sent back to the driver) keeps it; a configuration error stays a configuration error. ``python -m
vlmrl.train`` prints a start-up failure as one line and exits 2 (``vlmrl.train``).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vlmrl.config.errors import ConfigError

MAX_CAUSE = 500
"""Characters of an error message kept in a one-line summary."""


@dataclass
class StartupFailure:
    """Why a run (or one of its workers) could not start, as plain text that crosses a pipe or Ray."""

    what: str
    """What failed: ``worker 0 could not load the model from X``."""
    cause: str
    """The error, on one line: ``SafetensorError: ...``."""
    hint: str = ""
    """What to check."""
    details: str = ""
    """The full traceback, for the log file."""

    def line(self) -> str:
        """``what: cause; hint``."""
        return f"{self.what}: {self.cause}" + (f"; {self.hint}" if self.hint else "")


class StartupError(RuntimeError):
    """A run that could not start; ``failure`` says what, why and what to check."""

    def __init__(self, failure: StartupFailure) -> None:
        super().__init__(failure.line())
        self.failure = failure


def one_line(text: str, limit: int = MAX_CAUSE) -> str:
    """``text`` as one line: a traceback that follows the message is cut, whitespace runs become one space, and the
    rest is cut at ``limit`` characters."""
    kept = []
    for line in str(text).splitlines():
        if line.startswith(("Traceback (most recent call last)", "  File ")):
            break
        kept.append(line)
    flat = " ".join(" ".join(kept).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def error_text(e: BaseException) -> str:
    """``Type: message`` of an exception, on one line (a SyntaxError keeps its file and line)."""
    return one_line(f"{type(e).__name__}: {e}")


def failure_of(e: BaseException, what: str, hint: str = "") -> StartupFailure:
    """The failure ``e`` carries (a worker's, sent back), else one made of ``what``, ``e`` and ``hint``."""
    carried = getattr(e, "failure", None)
    if isinstance(carried, StartupFailure):
        return carried
    details = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return StartupFailure(what, error_text(e), hint, details)


@contextmanager
def stage(what: str, hint: str = "") -> Iterator[None]:
    """Run one step of a start: an exception leaving it becomes a :class:`StartupError` (see the module docstring)."""
    try:
        yield
    except (StartupError, ConfigError):
        raise
    except Exception as e:
        raise StartupError(failure_of(e, what, hint)) from e
