"""A bounded window of in-flight tasks: submit as others finish, so the flow never holds every shard's future."""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
# how long the flow blocks at most between looks at its clock when nothing is due (keeps it responsive)
POLL_S = 1.0


def completed_in_window(submit: Callable[[T], object], items: Iterable[T], window: Callable[[], int],
                        wait_s: Callable[[], float | None]) -> Iterator[tuple[T, object] | None]:
    """Submit ``submit(item)`` for each item, at most ``window()`` in flight; yield ``(item, future)`` as each
    finishes, in the order they finish.

    Yields None when ``wait_s()`` seconds (the caller's next deadline, e.g. a batch of commits that is due) pass
    with nothing finished, so the caller can act on time. A finished future is handed over and forgotten here:
    once the caller drops it, its result is released on the cluster. Futures must offer ``add_done_callback``
    (Prefect's do).
    """
    todo = deque(items)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    running = 0
    while todo or running:
        while todo and running < max(1, window()):
            item = todo.popleft()
            future = submit(item)
            future.add_done_callback(lambda f, item=item: finished.put((item, f)))
            running += 1
        deadline = wait_s()
        try:
            done = finished.get(timeout=POLL_S if deadline is None else min(max(deadline, 0.001), POLL_S))
        except queue.Empty:
            if deadline is not None and wait_s() == 0.0:
                yield None
            continue
        running -= 1
        yield done
