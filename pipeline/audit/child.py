"""Run one step in a child process, so the memory it needs only while it runs goes back to the system after.

A long-lived Dask worker keeps what it once allocated: freed memory stays with the process (the allocator keeps
it, fragmented), so every step that reads a whole probe set or release raises the worker's resident memory for the
hours it then embeds. Loading, gating and planning a probe set of millions of items held ~12 GiB for a minute; the
analyses, the comparison with the previous release and the report read every item of the release (DuckDB, within
its memory limit, and the frames they build): run in the worker, the analyses were its peak at 10 M items, 1.67
GiB against 1.40 GiB for its embedding (docs/benchmarks.md). A child process started with ``subprocess`` (a Dask
worker is a daemonic process, which ``multiprocessing`` may not give children) runs the step and exits; its result
and any exception come back pickled through a temporary folder. The child watches its parent
(:func:`pipeline.lifeline.watch_parent`): a worker stopped by Ctrl-C, or killed, takes it along within a second.

The child does not inherit ``MALLOC_TRIM_THRESHOLD_``, which Dask's nanny sets in its workers' environment
(``distributed.nanny.pre-spawn-environ``) so that a long-lived worker hands freed memory back. Any such glibc
setting also fixes the size above which every allocation is a fresh ``mmap``, so each large numpy array of the
analyses' bootstrap was mapped, faulted in page by page and unmapped: the analyses of 1 M items took 30.3 s with it
and 18.6 s without, at 0.63 and 0.67 GiB peak (docs/benchmarks.md). A child's memory goes back when it exits.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipeline.lifeline import stay_with

T = TypeVar("T")
# glibc tuning a child drops from its worker's environment (see above)
WORKER_ONLY_ENV = ("MALLOC_TRIM_THRESHOLD_",)


def run_in_child(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` in a fresh Python process (``fn`` importable by name, the arguments picklable); raises what
    it raised."""
    with tempfile.TemporaryDirectory(prefix="normaudit-child-") as tmp:
        given, taken = Path(tmp) / "call.pkl", Path(tmp) / "result.pkl"
        given.write_bytes(pickle.dumps((fn, args)))
        # the step's name last, for ps and top (and benchmarks/million_audit.py) to say which step a child runs
        proc = subprocess.run([sys.executable, "-m", "pipeline.audit.child", str(os.getpid()), str(given),
                               str(taken), fn.__name__.lstrip("_")], check=False, env=child_environment())
        if not taken.exists():
            raise RuntimeError(f"the child process running {fn.__name__} ended with exit code {proc.returncode} "
                               "before returning (killed for memory?); its output is above")
        ok, value = pickle.loads(taken.read_bytes())
    if not ok:
        raise value
    return value


def child_environment() -> dict[str, str]:
    """This process's environment without :data:`WORKER_ONLY_ENV`."""
    return {k: v for k, v in os.environ.items() if k not in WORKER_ONLY_ENV}


def _main(parent: str, given: str, taken: str) -> None:
    stay_with(int(parent), "its step")
    fn, args = pickle.loads(Path(given).read_bytes())
    try:
        out = (True, fn(*args))
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        out = (False, exc)
    partial = Path(f"{taken}.partial")  # renamed whole: a child killed while writing leaves no result to misread
    partial.write_bytes(pickle.dumps(out))
    partial.replace(taken)


if __name__ == "__main__":
    _main(*sys.argv[1:4])
