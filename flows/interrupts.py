"""Ctrl-C and SIGTERM during a run: the first one stops it, and nothing cuts its cleanup short.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, and a service manager
sends SIGTERM. Both become :class:`KeyboardInterrupt` in the CLI's main thread (Prefect turns
SIGTERM into its ``TerminationSignal`` while a flow runs; :func:`is_interrupt` accepts both).
The run's own cleanup (run record, lease, staging) runs :func:`shielded`: a second signal
during it is noted, not obeyed, so the cleanup always finishes (it takes well under a second).

The helper processes of a CLI run do not act on the terminal's signal themselves: the temporary
Prefect API runs in its own process group and local Dask workers ignore SIGINT; the CLI stops
them in order once the run has recorded its end.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command


class Interrupted(KeyboardInterrupt):
    """The run was interrupted and has recorded it; the message says what was kept."""


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C or SIGTERM (as Python or as Prefect raise them)."""
    # imported here: the CLI installs its handlers before Prefect is imported (seconds of imports)
    from prefect.exceptions import TerminationSignal

    return isinstance(exc, (KeyboardInterrupt, TerminationSignal))


def _note_stopping(signum, frame) -> None:  # noqa: ARG001 - the signal handler protocol
    print("stopping: the run has recorded its end; exiting", file=sys.stderr, flush=True)


def ignore_further_interrupts() -> None:
    """After the run recorded its end: a further Ctrl-C or SIGTERM only notes that the CLI is exiting."""
    if _in_main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _note_stopping)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame) -> None:  # noqa: ARG001 - the signal handler protocol
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def terminate_as_interrupt():
    """Let SIGTERM stop the CLI as Ctrl-C does (a KeyboardInterrupt), for the duration of the block."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def shielded(note: str = "stopping: finishing the cleanup first"):
    """Defer SIGINT and SIGTERM while the block runs; afterwards raise KeyboardInterrupt if one came.

    When the block itself ends with an exception, that exception goes on unchanged.
    """
    if not _in_main_thread():  # signal handlers belong to the main thread; elsewhere nothing to defer
        yield
        return
    received: list[int] = []

    def defer(signum, frame) -> None:  # noqa: ARG001 - the signal handler protocol
        if not received:
            print(note, file=sys.stderr, flush=True)
        received.append(signum)

    previous = {s: signal.signal(s, defer) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise KeyboardInterrupt(signal.Signals(received[0]).name)


def interruptible(command):
    """Decorate a CLI command: SIGTERM acts as Ctrl-C, and an interrupt ends it with one `error:` line and 130.

    The run itself has recorded its end by then (:func:`flows.audit.run_audit`); this only turns the
    interrupt into what a shell expects from a Ctrl-C'd command, without a traceback.
    """
    import functools

    @functools.wraps(command)
    def run(*args, **kwargs):
        import typer

        with terminate_as_interrupt():
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as exc:
                ignore_further_interrupts()
                message = str(exc) if isinstance(exc, Interrupted) else "interrupted; nothing was recorded yet"
                typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
                raise typer.Exit(EXIT_INTERRUPTED) from None

    return run
