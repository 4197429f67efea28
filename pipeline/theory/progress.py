"""Progress of long theory work (fine-tune steps, lab runs): a rich bar for CLI runs, log lines otherwise.

The library reports through :func:`step_reporter`; the CLI installs a terminal bar with
:func:`use_step_progress` for the duration of a command. Flows run elsewhere (a deployment, a test)
keep the default, which logs a line every tenth of the work.
"""

from __future__ import annotations

import contextlib
import logging

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

log = logging.getLogger("normaudit.progress")


class StepProgress:
    """Default reporter: a log line at every tenth of ``total`` (and the last)."""

    def start(self, label: str, total: int, unit: str = "steps") -> None:
        """Begin ``total`` units of work named ``label``."""
        self.label, self.total, self.unit, self.done, self._next = label, total, unit, 0, 0

    def update(self, done: int, **fields) -> None:
        """``done`` units finished; ``fields`` (e.g. ``loss``, ``stage``) describe the latest one."""
        self.done = done
        if done >= self._next or done >= self.total:
            extra = "".join(f", {k} {v:.4g}" if isinstance(v, float) else f", {k} {v}" for k, v in fields.items())
            log.info("%s: %d/%d %s%s", self.label, done, self.total, self.unit, extra)
            self._next = done + max(1, self.total // 10)

    def finish(self) -> None:
        """End the work (idempotent)."""


def _whole() -> Column:
    """A column kept on one line, never cut (each column needs its own)."""
    return Column(no_wrap=True)


class _InfoColumn(ProgressColumn):
    """The latest loss or stage, on one line: where the terminal is narrow it is the one cut, with "…"."""

    def render(self, task) -> Text:
        return Text(task.fields.get("info", ""), no_wrap=True, overflow="ellipsis")


class RichStepProgress(StepProgress):
    """A terminal bar: units done of total, the latest loss or stage, time elapsed and time left.

    Each :meth:`start` opens a new bar (a finished one stays printed above it).
    """

    def __init__(self) -> None:
        self._bar = None
        self._task = None

    def start(self, label: str, total: int, unit: str = "steps") -> None:
        self.finish()
        super().start(label, total, unit)
        # The counts and times first and whole; the stage or loss last, cut with "…" where the terminal is narrow
        # (a long run name once pushed the counts off an 80-column line).
        self._bar = Progress(TextColumn("{task.description}", table_column=_whole()), BarColumn(bar_width=24),
                             MofNCompleteColumn(table_column=_whole()),
                             TextColumn("{task.fields[unit]}", table_column=_whole()),
                             TimeElapsedColumn(table_column=_whole()), TextColumn("left", table_column=_whole()),
                             TimeRemainingColumn(table_column=_whole()), _InfoColumn(), transient=False)
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, unit=unit, info="")

    def update(self, done: int, **fields) -> None:
        self.done = done
        if self._task is None:
            return
        info = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
        self._bar.update(self._task, completed=done, info=info)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None


_current: StepProgress = StepProgress()


def step_reporter() -> StepProgress:
    """The reporter in use (process-wide: the flows run in the CLI's process)."""
    return _current


@contextlib.contextmanager
def use_step_progress(progress: StepProgress):
    """Install ``progress`` for the duration of a CLI run."""
    global _current
    previous, _current = _current, progress
    try:
        yield progress
    finally:
        progress.finish()
        _current = previous
