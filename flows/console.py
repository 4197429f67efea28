"""What a failed run prints on the terminal: the CLI's one ``error:`` line, not Prefect's tracebacks.

When a task fails, Prefect logs the failure with its traceback at every level it passes (the
task run, the subflow, the flow: three tracebacks for one bad shard), then the CLI prints the
error once with where its details are (the quarantine folder and GX result, the ``runs``
record). The console keeps every other line; the Prefect API's run logs keep the failure
records in full. Expected failures are the CLI's to report; an unexpected one still ends in
one traceback, the CLI's own.

Only the standard ``logging`` API is used: a filter on the root logger's console handlers,
which is where Prefect's logging configuration sends run logs to the terminal.
"""

from __future__ import annotations

import logging

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
