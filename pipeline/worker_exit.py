"""Dask preload of the *local* cluster's worker processes: ignore Ctrl-C, leave without the teardown.

**Ctrl-C.** A terminal's Ctrl-C sends SIGINT to the whole process group, local workers included.
A worker that died of it would be restarted by its nanny while the CLI stops the run, and
closing a cluster whose worker is (re)starting waits for it. The CLI owns its local workers:
they ignore SIGINT (set at import, the earliest moment a preload runs) and are stopped by the
CLI once the run has recorded its end; if the CLI itself dies, ``distributed`` ends them.

**Exit.**
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
import signal
import sys
import threading

if threading.current_thread() is threading.main_thread():  # a preload is imported on the worker's main thread
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _leave_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(0)


def dask_setup(worker) -> None:  # noqa: ARG001 - the preload protocol passes the worker
    """Register the fast exit (last registered, so it runs first at exit)."""
    atexit.register(_leave_now)
