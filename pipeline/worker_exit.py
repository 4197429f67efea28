"""Dask preload of the *local* cluster's worker processes: leave without the interpreter's teardown.

Tearing down torch, transformers and sentence-transformers module by module takes over a
second on a small machine, and the audit waits for it when it closes its local cluster. A
local worker has nothing left to save when its nanny closes it (results went back over the
wire, parts were written atomically), so at exit it flushes its streams and leaves at once.
Workers of an external cluster do not load this module: their exit status stays theirs.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys


def _leave_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(0)


def dask_setup(worker) -> None:  # noqa: ARG001 - the preload protocol passes the worker
    """Register the fast exit (last registered, so it runs first at exit)."""
    atexit.register(_leave_now)
