"""Progress of long work: a bar for CLI runs, log lines otherwise. The one progress module of normaudit.

Three kinds of work report here: an audit's shards and items (:meth:`LogProgress.start`,
:meth:`~LogProgress.advance`), work of a few named steps, such as a paired comparison
(:meth:`~LogProgress.begin_steps`, :meth:`~LogProgress.step`, :meth:`~LogProgress.end_steps`), and counted
units of theory work, fine-tune steps or lab runs (:class:`StepProgress`). A run of several audits
(``serve --once``) titles each with :meth:`~LogProgress.section`.

Library code reports through :func:`reporter` (audits, comparisons) or :func:`step_reporter` (theory work);
the CLI installs a rich bar with :func:`use_progress` or :func:`use_step_progress` for the duration of a
command. Deployed runs and tests keep the defaults, which only log (the step reporter a line every tenth).
"""

from __future__ import annotations

import contextlib
import logging
import threading

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

log = logging.getLogger("normaudit.progress")


class LogProgress:
    """Default reporter: a log line per committed shard, per step and per section."""

    def start(self, label: str, shards: int, items: int) -> None:
        self.label, self.shards, self.items, self.done_shards, self.done_items = label, shards, items, 0, 0

    def advance(self, items: int) -> None:
        self.done_shards += 1
        self.done_items += items
        log.info("%s: %d/%d shards, %d/%d items", self.label, self.done_shards, self.shards,
                 self.done_items, self.items)

    def finish(self) -> None:
        pass

    def section(self, title: str) -> None:
        """A heading for the work that follows (e.g. which release of several is audited now)."""
        log.info("%s", title)

    def begin_steps(self, label: str, total: int) -> None:
        """Work of ``total`` named steps begins; each :meth:`step` names the one that starts."""
        self.steps_label, self.steps_total, self.steps_done = label, total, -1

    def step(self, name: str) -> None:
        """The previous step is done and ``name`` starts."""
        self.steps_done += 1
        log.info("%s: step %d/%d: %s", self.steps_label, self.steps_done + 1, self.steps_total, name)

    def end_steps(self) -> None:
        """The last step is done."""


class RichProgress(LogProgress):
    """Terminal progress bars: shards and items of each probe set; the steps of a comparison.

    ``transient``: the bars vanish when the work ends (a command whose result follows them, such as
    ``compare``); else they stay above the summary. ``delay_s``: show the bars only once the work has run
    that long, so quick work prints none. ``console``: where to draw (default: rich's, on stdout).
    """

    def __init__(self, transient: bool = False, delay_s: float = 0.0, console=None):
        # Redrawn twice a second, not rich's default ten: the bars live in the flow's process for the whole audit,
        # and at 10 Hz the redraws alone cost it 0.56% of a core in a pipe (0.112 CPU-s in 20 s; 0.020 at 2 Hz).
        self._bar = Progress(SpinnerColumn(finished_text=" "), TextColumn("{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                             transient=transient, console=console, refresh_per_second=2)
        self._delay_s = delay_s
        # a transient bar leaves nothing behind: in a file or a pipe (no terminal) it is not drawn at all
        self._drawn = not transient or self._bar.console.is_terminal
        self._shown: threading.Timer | None = None
        self._task = None
        self._steps = None

    def _show(self) -> None:
        if not self._drawn:
            return
        if self._delay_s <= 0:
            self._bar.start()
        elif self._shown is None:  # the display starts later, from a timer thread (rich's Progress is thread-safe)
            self._shown = threading.Timer(self._delay_s, self._bar.start)
            self._shown.daemon = True
            self._shown.start()

    def _hide(self) -> None:
        if self._shown is not None:
            self._shown.cancel()
            self._shown.join()  # a start under way completes first, so the stop below stops it
            self._shown = None
        if self._bar.live.is_started:  # rich's stop of a bar never started still prints an empty line in a file
            self._bar.stop()

    def start(self, label: str, shards: int, items: int) -> None:
        super().start(label, shards, items)
        if shards:
            self._show()
            self._task = self._bar.add_task(f"embedding {label}", total=items, detail=f"shards 0/{shards}")

    def advance(self, items: int) -> None:
        self.done_shards += 1
        self.done_items += items
        if self._task is not None:
            self._bar.update(self._task, advance=items, detail=f"shards {self.done_shards}/{self.shards}")

    def finish(self) -> None:
        if self._task is not None or self._steps is not None:
            self._hide()
            self._task = self._steps = None

    def section(self, title: str) -> None:
        self._bar.console.print(title)  # above the live bars, when they show

    def begin_steps(self, label: str, total: int) -> None:
        super().begin_steps(label, total)
        self._show()
        self._steps = self._bar.add_task(label, total=total, detail="")

    def step(self, name: str) -> None:
        self.steps_done += 1
        if self._steps is not None:
            self._bar.update(self._steps, completed=self.steps_done, detail=name)

    def end_steps(self) -> None:
        if self._steps is not None:
            # the steps' line leaves the display: an audit's bars above it stay as they were
            self._bar.remove_task(self._steps)
            self._steps = None
            if self._task is None:
                self._hide()


# The reporters in use, process-wide (the flows run in the CLI's process): one for items, one for steps
_current: dict[str, object] = {}


@contextlib.contextmanager
def _installed(slot: str, progress):
    """Install ``progress`` in ``slot`` for the duration of a CLI run; finish it and restore the previous one."""
    previous, _current[slot] = _current[slot], progress
    try:
        yield progress
    finally:
        progress.finish()
        _current[slot] = previous


def reporter() -> LogProgress:
    """The item reporter in use."""
    return _current["items"]


def use_progress(progress: LogProgress):
    """Install ``progress`` for the duration of a CLI run."""
    return _installed("items", progress)


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


def step_reporter() -> StepProgress:
    """The step reporter in use."""
    return _current["steps"]


def use_step_progress(progress: StepProgress):
    """Install ``progress`` for the duration of a CLI run."""
    return _installed("steps", progress)


_current.update(items=LogProgress(), steps=StepProgress())
