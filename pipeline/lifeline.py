"""Die with the parent: a process started for one run must not outlive it, even after SIGKILL.

A SIGKILLed process runs no exit handler, so it cannot stop what it started. Each helper process watches
instead: a daemon thread polls its parent process id, and when the parent is gone (the process was
re-parented) it asks its own process to stop with SIGTERM, which servers such as uvicorn answer with a graceful
shutdown, then SIGKILLs itself if it is still there after a grace period. The Prefect API under a CLI run
(:mod:`flows.parent_watch`) and a worker's child process (:mod:`pipeline.audit.child`) use it.

Why a polling thread and not Linux's ``PR_SET_PDEATHSIG``: the death signal is tied to the *thread* that spawned
the child (the CLI and a Dask worker spawn from background threads), it is Linux-only, and setting it needs
``preexec_fn``, which is unsafe once threads run. Polling twice a second costs nothing measurable and works on
every POSIX system.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

POLL_S = 0.5
GRACE_S = 5.0


def watch_parent(parent_pid: int | None = None, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> threading.Thread:
    """Start a daemon thread that stops this process when ``parent_pid`` (default: the current parent) is gone."""
    parent = os.getppid() if parent_pid is None else parent_pid

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGKILL)  # the graceful stop did not finish: nothing else may keep us

    thread = threading.Thread(target=watch, name="normaudit-parent-watch", daemon=True)
    thread.start()
    return thread


def stay_with(parent_pid: int, what: str) -> None:
    """Exit at once (naming ``what``) when ``parent_pid`` is no longer this process's parent, else start
    :func:`watch_parent` on it: the start of a helper process that must not outlive the process that started it."""
    if os.getppid() != parent_pid:
        sys.exit(f"parent process {parent_pid} is already gone; not starting {what}")
    watch_parent(parent_pid)
