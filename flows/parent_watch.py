"""Die with the parent: a helper process of one CLI run must not outlive it, even after SIGKILL.

A SIGKILLed CLI runs no exit handler, so it cannot stop what it started. Each helper
process watches instead: a daemon thread polls its parent process id, and when the
parent is gone (the process was re-parented) it asks its own process to stop with
SIGTERM, which servers such as uvicorn answer with a graceful shutdown, then SIGKILLs
itself if it is still there after a grace period.

Why a polling thread and not Linux's ``PR_SET_PDEATHSIG``: the death signal is tied to
the *thread* that spawned the child (the CLI spawns from background threads too), it
is Linux-only, and setting it needs ``preexec_fn``, which is unsafe once threads run.
Polling twice a second costs nothing measurable and works on every POSIX system.

Dask's local worker processes need none of this: ``distributed`` already ends a worker
whose nanny's process (here the CLI) is gone.

Run a module under the watch with ``python -m flows.parent_watch PARENT_PID MODULE [ARGS...]``:
it exits at once when ``PARENT_PID`` is not its parent, else runs ``MODULE`` as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
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


def main(argv: list[str]) -> None:
    """``PARENT_PID MODULE [ARGS...]``: run ``MODULE`` as ``python -m`` would, stopping when the parent is gone."""
    if len(argv) < 2:
        sys.exit("usage: python -m flows.parent_watch PARENT_PID MODULE [ARGS...]")
    parent = int(argv[0])
    if os.getppid() != parent:
        sys.exit(f"parent process {parent} is already gone; not starting {argv[1]}")
    watch_parent(parent)
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
