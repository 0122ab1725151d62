"""Process lifetime: every process a run starts ends with the one that started it.

Local CPU workers, reward and tool workers are forked from a forkserver, itself a child of the process that started it
(GPU workers are spawned children of the driver). ``die_with_parent`` asks the Linux kernel to end the calling process
when its parent exits, even on a ``kill -9`` (``PR_SET_PDEATHSIG``); elsewhere it does nothing."""

from __future__ import annotations

import os
import signal
import sys

FORKSERVER_PARENT = "VLMRL_FORKSERVER_PARENT"
"""The environment variable naming the pid of the process whose forkserver this is (``vlmrl._forkserver_guard``)."""


def die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent exits (the parent thread, strictly: start
    children from the main thread)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def parent_is(pid: int) -> bool:
    """Whether this process's parent is still ``pid`` (not gone, leaving this one to init)."""
    return os.getppid() == pid
