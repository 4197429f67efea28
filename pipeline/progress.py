"""Progress of shards and items: a bar for CLI runs, log lines otherwise.

The flow reports through :func:`reporter`; the CLI installs a rich bar with
:func:`use_progress`. Deployed runs keep the default, which only logs.
"""

from __future__ import annotations

import contextlib
import logging

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger("normaudit.progress")


class LogProgress:
    """Default reporter: a log line per committed shard."""

    def start(self, label: str, shards: int, items: int) -> None:
        self.label, self.shards, self.items, self.done_shards, self.done_items = label, shards, items, 0, 0

    def advance(self, items: int) -> None:
        self.done_shards += 1
        self.done_items += items
        log.info("%s: %d/%d shards, %d/%d items", self.label, self.done_shards, self.shards,
                 self.done_items, self.items)

    def finish(self) -> None:
        pass


class RichProgress(LogProgress):
    """A terminal progress bar of shards and items."""

    def __init__(self):
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[shards]}"), TimeElapsedColumn(), transient=False)
        self._task = None

    def start(self, label: str, shards: int, items: int) -> None:
        super().start(label, shards, items)
        if shards:
            self._bar.start()
            self._task = self._bar.add_task(f"embedding {label}", total=items, shards=f"shards 0/{shards}")

    def advance(self, items: int) -> None:
        self.done_shards += 1
        self.done_items += items
        if self._task is not None:
            self._bar.update(self._task, advance=items, shards=f"shards {self.done_shards}/{self.shards}")

    def finish(self) -> None:
        if self._task is not None:
            self._bar.stop()
            self._task = None


_current: LogProgress = LogProgress()


def reporter() -> LogProgress:
    """The reporter in use (process-wide: the flow runs in the CLI's process)."""
    return _current


@contextlib.contextmanager
def use_progress(progress: LogProgress):
    """Install ``progress`` for the duration of a CLI run."""
    global _current
    previous, _current = _current, progress
    try:
        yield progress
    finally:
        progress.finish()
        _current = previous
