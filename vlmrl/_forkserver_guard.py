"""Imported once in a supervised pool's forkserver (``vlmrl.supervise.PRELOAD``), never elsewhere: the forkserver ends
with the process that started it (``vlmrl.procs``), so its workers, which die with it, do too."""

import os

from vlmrl.procs import FORKSERVER_PARENT, die_with_parent, parent_is

die_with_parent()
_parent = os.environ.get(FORKSERVER_PARENT)
if _parent and not parent_is(int(_parent)):  # the parent died before the guard was set
    os._exit(0)
