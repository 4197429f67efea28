"""Run one step in a child process, so the memory it needs only while it runs goes back to the system after.

Loading, gating and planning a probe set of millions of items holds gigabytes for a minute; in a long-lived Dask
worker that memory stays with the process once freed (the allocator keeps it), the nanny restarts a worker whose
resident memory passes its limit, and the worker then embeds for hours beside it. A child process started with
``subprocess`` (a Dask worker is a daemonic process, which ``multiprocessing`` may not give children) runs the
step and exits; its result and any exception come back pickled through a temporary folder.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def run_in_child(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` in a fresh Python process (``fn`` importable by name, the arguments picklable); raises what
    it raised."""
    with tempfile.TemporaryDirectory(prefix="normaudit-child-") as tmp:
        given, taken = Path(tmp) / "call.pkl", Path(tmp) / "result.pkl"
        given.write_bytes(pickle.dumps((fn, args)))
        proc = subprocess.run([sys.executable, "-m", "pipeline.audit.child", str(given), str(taken)], check=False)
        if not taken.exists():
            raise RuntimeError(f"the child process running {fn.__name__} ended with exit code {proc.returncode} "
                               "before returning (killed for memory?); its output is above")
        ok, value = pickle.loads(taken.read_bytes())
    if not ok:
        raise value
    return value


def _main(given: str, taken: str) -> None:
    fn, args = pickle.loads(Path(given).read_bytes())
    try:
        out = (True, fn(*args))
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        out = (False, exc)
    Path(taken).write_bytes(pickle.dumps(out))


if __name__ == "__main__":
    _main(*sys.argv[1:3])
