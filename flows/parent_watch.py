"""Run a module under the watch of :func:`pipeline.lifeline.watch_parent`: a helper process of one CLI run (the
Prefect API server) must not outlive it, even after SIGKILL.

Dask's local worker processes need none of this: ``distributed`` already ends a worker whose nanny's process
(here the CLI) is gone.

Run a module under the watch with ``python -m flows.parent_watch PARENT_PID MODULE [ARGS...]``:
it exits at once when ``PARENT_PID`` is not its parent, else runs ``MODULE`` as ``__main__``.
"""

from __future__ import annotations

import runpy
import sys

from pipeline.lifeline import stay_with


def main(argv: list[str]) -> None:
    """``PARENT_PID MODULE [ARGS...]``: run ``MODULE`` as ``python -m`` would, stopping when the parent is gone."""
    if len(argv) < 2:
        sys.exit("usage: python -m flows.parent_watch PARENT_PID MODULE [ARGS...]")
    stay_with(int(argv[0]), argv[1])
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
