"""What a CLI run prints on the terminal: progress, warnings, errors and the summary; the run logs keep the rest.

**Quiet by default.** Prefect logs a line per task run at INFO, and Great Expectations and the
Dask task runner add their own: about 30 lines between the progress bar and the summary of a
demo audit. :func:`quiet_console` raises the level of the console handler of Prefect's logging
configuration to WARNING through Prefect's documented override of its logging config
(``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL``), in the CLI process and, by inheritance, in its
local Dask worker processes. Loggers keep their levels, so Prefect's API log handler still
receives every record: the run logs hold the per-task lines. ``--verbose`` keeps Prefect's
console as it is.

**No link to a server that is gone.** With the temporary API (no ``PREFECT_API_URL``), Prefect
would print "View at http://127.0.0.1:…/runs/…" for every flow run: a server with no UI that
stops when the command ends. An empty ``PREFECT_UI_URL`` tells Prefect there is no UI, so it
prints no link. The local cluster's scheduler likewise has no dashboard (its plain HTTP routes
only) and stops with the command: an empty ``distributed.dashboard.link`` template (Dask config)
makes its link empty, which the Dask task runner does not print. A running server or cluster the
user named keeps its links.

**A failure once.** When a task fails, Prefect logs the failure with its traceback at every level it passes (the
task run, the subflow, the flow: three tracebacks for one bad shard), then the CLI prints the
error once with where its details are (the quarantine folder and GX result, the ``runs``
record). :func:`failures_once_on_console` filters those records off the console; the Prefect
API's run logs keep them in full. Expected failures are the CLI's to report; an unexpected one
still ends in one traceback, the CLI's own.

Only environment settings that Prefect and Dask document, and the standard ``logging`` API, are used.
"""

from __future__ import annotations

import logging
import os

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_FAILED_STATES = ("Finished in state Failed(", "Finished in state Crashed(")


class FailureRecordsFilter(logging.Filter):
    """Drop flow and task run records that report a failure: an exception, or a failed final state."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(RUN_LOGGERS):
            return True
        if record.exc_info or record.levelno >= logging.ERROR:
            return False
        return not str(record.msg).startswith(_FAILED_STATES)


def failures_once_on_console() -> None:
    """Filter run-failure records out of the terminal (idempotent); call after Prefect set up its logging."""
    for handler in logging.getLogger().handlers:
        is_console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if is_console and not any(isinstance(f, FailureRecordsFilter) for f in handler.filters):
            handler.addFilter(FailureRecordsFilter())


def quiet_console(verbose: bool = False, local_cluster: bool = True) -> None:
    """Set what this CLI run prints; call before Prefect, Dask or the local cluster start.

    The settings go into this process's environment, which the temporary API and the local
    worker processes inherit; the CLI process is the run, so they end with it. A value the user
    already set is kept. ``local_cluster`` says the run starts its own Dask cluster (no
    scheduler address was given).
    """
    if not verbose:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    # The same test as the temporary API's start (flows.boot): without PREFECT_API_URL the API is this run's own.
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_UI_URL", "")
    if local_cluster:
        os.environ.setdefault("DASK_DISTRIBUTED__DASHBOARD__LINK", "")
