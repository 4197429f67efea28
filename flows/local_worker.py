"""Dask preload of the *local* cluster's worker processes: Ctrl-C is the CLI's, never a worker's.

A terminal's Ctrl-C sends SIGINT to the whole process group, local workers included. A worker
that died of it would be restarted by its nanny while the CLI stops the run, and closing a
cluster whose worker is (re)starting waits for it. The CLI owns its local workers: they hold
SIGINT blocked from birth (:func:`flows.boot.start_local_cluster`), and this preload, imported on
the worker's main thread before the worker starts, makes them ignore it for good (a library thread
that unblocks SIGINT, as multiprocessing's resource tracker does, can no longer let one in). The
CLI stops them once the run has recorded its end; if the CLI itself dies, ``distributed`` ends them.

A worker ends as any Python process does, exit handlers included: its exit status is its own.
Workers of an external cluster do not load this module.

A failure once, here too: a shard fails on the worker that embeds it, and Prefect's task engine there logs the
failure with its traceback to the worker's stderr, which is the CLI's terminal. The CLI's own filter
(:func:`flows.console.failures_once_on_console`) is installed on the worker's console handlers as soon as
Prefect, which sets its logging up lazily, logs its first run record; the run logs keep the records in full.
"""

from __future__ import annotations

import logging
import signal
import threading

from flows.console import RUN_LOGGERS, failures_once_on_console


class _FilterFailuresOnceSetUp(logging.Filter):
    """On a run logger: install the console's failure filter when the first record is logged (Prefect's handlers
    exist by then), before the record reaches those handlers; drops nothing itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        failures_once_on_console()
        return True


if threading.current_thread() is threading.main_thread():  # a preload is imported on the worker's main thread
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in RUN_LOGGERS:
        logging.getLogger(name).addFilter(_FilterFailuresOnceSetUp())
