"""Batched commits: the flow adds finished parts to a manifest a batch at a time, not one write per part."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.storage.parts import WrittenPart

MAX_BATCH_PARTS = 32  # parts per manifest write at most
MAX_BATCH_WAIT_S = 5.0  # a written part waits at most this long for its commit (while the flow is waiting anyway)


class BatchCommitter:
    """Collects written parts and commits them with ``commit`` once ``max_parts`` are waiting or the oldest has
    waited ``max_wait_s``, whichever comes first.

    A part is visible only once its batch is committed; one still waiting when the flow is killed is an orphan
    the next audit reuses (:mod:`pipeline.storage.parts`). ``commit`` gets the list of parts and returns the rows
    it committed.
    """

    def __init__(self, commit: Callable[[list[WrittenPart]], int], max_parts: int = MAX_BATCH_PARTS,
                 max_wait_s: float = MAX_BATCH_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._commit, self.max_parts, self.max_wait_s, self._clock = commit, max_parts, max_wait_s, clock
        self.pending: list[WrittenPart] = []
        self._oldest: float | None = None
        self.batches = 0  # manifest writes so far
        self.rows = 0  # rows committed so far

    def add(self, part: WrittenPart) -> int:
        """Queue a part; commit the batch if it is due. Returns the rows committed now (0 if none)."""
        if not self.pending:
            self._oldest = self._clock()
        self.pending.append(part)
        return self.flush() if self.due() else 0

    def due(self) -> bool:
        """Whether the waiting parts should be committed now."""
        return bool(self.pending) and (len(self.pending) >= self.max_parts or self.wait_s() == 0.0)

    def wait_s(self) -> float | None:
        """Seconds until the waiting parts are due (0 when they are), None when none wait."""
        if not self.pending:
            return None
        return max(0.0, self._oldest + self.max_wait_s - self._clock())

    def flush(self) -> int:
        """Commit every waiting part now (one manifest write); returns the rows committed.

        When the commit raises, the parts are still :attr:`pending`."""
        if not self.pending:
            return 0
        # the parts stay pending until their commit succeeds: a failed commit leaves them for the caller to retry
        # (or, when the run stops, as orphans the next audit reuses), never silently dropped
        rows = self._commit(list(self.pending))
        self.pending, self._oldest = [], None
        self.batches += 1
        self.rows += rows
        return rows
