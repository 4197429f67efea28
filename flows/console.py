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

**Dask's housekeeping.** Dask logs some of its own routine at WARNING: a worker closed while a task runs
(an interrupted run) reports each cancelled instruction (``distributed.worker.state_machine``), and a nanny
whose worker is slow to exit at the end of a run says it kills it (``distributed.nanny``), and a worker process
that the interrupt reached before its nanny did has "exit status was already read" (``distributed.process``).
None is news for the run's user; Dask's documented logging config (``distributed.logging``: logger -> level,
through its ``DASK_DISTRIBUTED__LOGGING`` variable, which the worker processes inherit) raises those loggers to
ERROR. A worker restarted for exceeding its memory (``distributed.nanny.memory``) still shows. Workers ended
after an interrupt may leave a semaphore registered with multiprocessing's resource tracker, which removes it
when the command exits and warns that it did ("There appear to be 1 leaked semaphore objects"): a warnings
filter in ``PYTHONWARNINGS``, which the tracker process inherits, ignores the tracker's ``UserWarning`` by its
category and module (never by its text).

**A failure once.** When a task fails, Prefect logs the failure with its traceback at every level it passes (the
task run, the subflow, the flow: three tracebacks for one bad shard), then the CLI prints the
error once with where its details are (the quarantine folder and GX result, the ``runs``
record). :func:`failures_once_on_console` filters those records off the console; the Prefect
API's run logs keep them in full. A run interrupted before its engine made the run's logger reports its crash
through ``prefect.engine`` instead; that one record is filtered too, and the rest of that logger shows.
Expected failures are the CLI's to report; an unexpected one still ends in one traceback, the CLI's own.

**Filters by text, only where nothing else tells a record apart.** Every filter here goes by logger, level or
exception, except two, kept because Prefect gives those records no other mark (the same logger and level as
records that must show): a flow run's final state ``Finished in state Failed(...)``/``Crashed(...)``, logged at
INFO like ``Completed()``, and ``Crash detected! ...`` on ``prefect.engine`` at ERROR, beside the engine's
other errors. Both were written for Prefect 3.9.1 (:data:`TEXT_FILTERS_WRITTEN_FOR`; ``flow_engine.py`` and
``task_engine.py``: ``handle_crash`` and the final-state line), and
``tests/test_console.py::test_the_records_filtered_by_text_are_still_worded_so`` runs real failing and
crashing flows and fails when Prefect words them otherwise.

Only environment settings that Prefect and Dask document, and the standard ``logging`` API, are used.
"""

from __future__ import annotations

import json
import logging
import os

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# A run's engine logs through "prefect.engine" until it has made the run's own logger: an interrupt in that
# window reports the run's crash there (Prefect 3's flow and task engines start with get_logger("engine")).
ENGINE_LOGGER = "prefect.engine"
# The only message-text filters (see the module docstring), with the version they were written for.
TEXT_FILTERS_WRITTEN_FOR = "prefect 3.9.1"
FAILED_STATES = ("Finished in state Failed(", "Finished in state Crashed(")
CRASH = "Crash detected!"
# Dask loggers whose warnings are its housekeeping (see the module docstring), by level; a logger's own level
# holds for it alone, so the children named below keep theirs.
QUIET_DASK_LOGGERS = {
    "distributed.worker.state_machine": "error",
    "distributed.nanny": "error",
    "distributed.process": "error",
    "distributed.nanny.memory": "warning",
}
# action:message:category:module of Python's warnings filter: every UserWarning the tracker's module issues
# (its leaked-resource reports), by category and module, not by text
QUIET_TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"


class FailureRecordsFilter(logging.Filter):
    """Drop flow and task run records that report a failure: an exception, or a failed final state."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == ENGINE_LOGGER:
            return not str(record.msg).startswith((CRASH, *FAILED_STATES))
        if not record.name.startswith(RUN_LOGGERS):
            return True
        if record.exc_info or record.levelno >= logging.ERROR:
            return False
        return not str(record.msg).startswith(FAILED_STATES)  # a flow run's final state: INFO, as Completed()


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
        # JSON is a Python literal too, which is how Dask parses a variable's value into a mapping
        os.environ.setdefault("DASK_DISTRIBUTED__LOGGING", json.dumps(QUIET_DASK_LOGGERS))
        # after the user's own filters, so it takes precedence for this one warning only
        given = os.environ.get("PYTHONWARNINGS", "")
        if QUIET_TRACKER_WARNING not in given:
            os.environ["PYTHONWARNINGS"] = ",".join(filter(None, (given, QUIET_TRACKER_WARNING)))
    # The same test as the temporary API's start (flows.boot): without PREFECT_API_URL the API is this run's own.
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_UI_URL", "")
    if local_cluster:
        os.environ.setdefault("DASK_DISTRIBUTED__DASHBOARD__LINK", "")
