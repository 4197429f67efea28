"""Ctrl-C and SIGTERM during a run: the first one stops it, and nothing cuts its cleanup short.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, and a service manager
sends SIGTERM. Both become :class:`KeyboardInterrupt` in the CLI's main thread (Prefect turns
SIGTERM into its ``TerminationSignal`` while a flow runs; :func:`is_interrupt` accepts both).
The run's own cleanup (run record, lease) runs :func:`shielded`: a second signal
during it is noted, not obeyed, so the cleanup always finishes (it takes well under a second).

The helper processes of a CLI run do not act on the terminal's signal themselves: the temporary
Prefect API runs in its own process group and local Dask workers ignore SIGINT; the CLI stops
them in order once the run has recorded its end.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading

import typer

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a terminal's Ctrl-C, a service manager's stop


class Interrupted(KeyboardInterrupt):
    """The run was interrupted and has recorded it; the message says what was kept."""


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C or SIGTERM (as Python or as Prefect raise them); if so, it is being acted on."""
    if _interrupted.is_set() or interrupt_in(exc) is not None or _serialized_termination(exc):
        # after a Ctrl-C any error is its consequence: a library may wrap the KeyboardInterrupt in its own error.
        # SIGTERM during a flow meets Prefect's handler, not ours (no flag set): raised inside a pydantic
        # serializer, its TerminationSignal comes out as PydanticSerializationError, with it as the cause.
        _pending.clear()
        return True
    return False


def _serialized_termination(exc: BaseException) -> bool:
    """Prefect's TerminationSignal raised inside a pydantic-core serializer but not kept as the error's cause:
    pydantic-core (2.x) then keeps only its name in the message ("Error calling function `_ser_model`:
    TerminationSignal: "), so the type and that name are all there is to recognise it by (CI saw it once)."""
    from pydantic_core import PydanticSerializationError  # imported here: kept out of the CLI's start-up, as Prefect

    return any(isinstance(e, PydanticSerializationError) and "TerminationSignal" in str(e) for e in _chain(exc))


def interrupt_in(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or Prefect TerminationSignal ``exc`` is or was raised from, if any."""
    # imported here: the CLI installs its handlers before Prefect is imported (seconds of imports)
    from prefect.exceptions import TerminationSignal

    return next((e for e in _chain(exc) if isinstance(e, (KeyboardInterrupt, TerminationSignal))), None)


def _chain(exc: BaseException):
    """``exc`` and the exceptions it was raised from or while handling (``__cause__``, ``__context__``)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def interrupt_seen() -> bool:
    """Whether a Ctrl-C or SIGTERM arrived during the current command (see :func:`terminate_as_interrupt`)."""
    return _interrupted.is_set()


class _DropAfterInterrupt(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # noqa: ARG002 - the logging.Filter protocol
        return not _interrupted.is_set()


def quiet_after_interrupt(*loggers: str) -> None:
    """From the command's first Ctrl-C or SIGTERM on, drop the records of ``loggers``: what they say then is
    about the run being stopped. Before it, they show as usual."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAfterInterrupt) for f in logger.filters):
            logger.addFilter(_DropAfterInterrupt())


def interrupt_signal() -> str | None:
    """The name of the first signal that interrupted the current command (``SIGINT``, ``SIGTERM``), if any."""
    return _first_signal[0] if _first_signal else None


def signal_name(exc: BaseException) -> str:
    """The name of the signal behind the interrupt ``exc`` (for which :func:`is_interrupt` is true)."""
    signum = getattr(interrupt_in(exc) or exc, "signal", None)  # Prefect's TerminationSignal carries it
    if signum is not None:
        return signal.Signals(signum).name
    if _serialized_termination(exc):
        # Prefect raises TerminationSignal for SIGTERM only; lost inside pydantic-core, it never reached the
        # handler Prefect restores and re-signals (ours), so interrupt_signal() has not seen it (CI: recorded
        # as "interrupted by SIGINT")
        return "SIGTERM"
    # the CLI's handler noted the signal; ``exc`` may be a library's error wrapped around the interrupt
    return interrupt_signal() or (str(exc) if isinstance(exc, KeyboardInterrupt) else "") or "SIGINT (Ctrl-C)"


# An interrupt raised in the main thread and not yet acted on. Python runs a signal handler between any two
# bytecodes of the main thread, also inside a weakref callback, a finalizer or a gc callback (importlib and
# distributed run such callbacks all the time while starting); a KeyboardInterrupt raised there is reported
# to sys.unraisablehook ("Exception ignored in ...") and lost. The hook below notes such a loss and the
# resender raises the interrupt again at once, from outside that callback. A library that swallows the
# interrupt some other way (an ``except BaseException``) is covered by a resend every RESEND_S; both stop
# once code that acts on the interrupt has seen it (:func:`is_interrupt`, or the CLI's wrapper).
_pending = threading.Event()
_lost = threading.Event()  # the pending interrupt was swallowed by a callback: resend it now
_interrupted = threading.Event()  # sticky for the command: an interrupt arrived
_first_signal: list[str] = []  # the name of the signal that set it
RESEND_S, RESENDS = 2.0, 10


def _resend_until_seen() -> None:
    for _ in range(RESENDS):
        _lost.wait(RESEND_S)
        _lost.clear()
        if not _pending.is_set():
            return
        # to the process: the interpreter runs the Python handler in the main thread, where the run waits
        os.kill(os.getpid(), signal.SIGINT)


def _note_lost(unraisable, previous=None) -> None:
    if _pending.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
        _lost.set()  # resent by _resend_until_seen; its traceback would only be noise
        return
    (previous or sys.__unraisablehook__)(unraisable)


def _note_stopping(signum, frame) -> None:  # noqa: ARG001 - the signal handler protocol
    print("stopping: the run has recorded its end; exiting", file=sys.stderr, flush=True)


def ignore_further_interrupts() -> None:
    """After the run recorded its end: a further Ctrl-C or SIGTERM only notes that the CLI is exiting."""
    _handle_interrupts(_note_stopping)


def ignore_interrupts_to_exit() -> None:
    """Right before the CLI exits after an interrupt: a further Ctrl-C or SIGTERM is ignored outright.

    A Python handler would not last to the end: once the exit handlers have run, Python puts back the default
    action of every signal with a Python handler, and a second Ctrl-C landing while it tears its modules down
    (a CI run caught one 0.3 s after the first) killed the CLI by the signal instead of letting it return the
    130 it was about to return. An ignored signal stays ignored. What is left to run is bounded (the
    temporary API's stop waits at most 5 s before it kills the server).
    """
    _handle_interrupts(signal.SIG_IGN)


def _handle_interrupts(handler) -> None:
    if _in_main_thread():  # signal handlers belong to the main thread
        for s in INTERRUPT_SIGNALS:
            signal.signal(s, handler)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum, frame) -> None:  # noqa: ARG001 - the signal handler protocol
    if not _interrupted.is_set():
        # kept apart from the exception: a library may wrap the KeyboardInterrupt in an error of its own
        _first_signal[:] = [signal.Signals(signum).name]
    _interrupted.set()
    if not _pending.is_set():
        _pending.set()
        threading.Thread(target=_resend_until_seen, name="normaudit-interrupt", daemon=True).start()
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def terminate_as_interrupt():
    """For the duration of the block, SIGTERM stops the CLI as Ctrl-C does, and neither is ever lost.

    Both raise :class:`KeyboardInterrupt`, raised again until :func:`is_interrupt` (or the CLI) has seen it.
    """
    if not _in_main_thread():
        yield
        return
    _interrupted.clear()
    _first_signal.clear()
    previous = {s: signal.signal(s, _raise_interrupt) for s in INTERRUPT_SIGNALS}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_note_lost, previous=previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        if not _interrupted.is_set():  # after an interrupt the handlers of ignore_further_interrupts stay
            for s, handler in previous.items():
                signal.signal(s, handler)


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

    previous = {s: signal.signal(s, defer) for s in INTERRUPT_SIGNALS}
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
    @functools.wraps(command)
    def run(*args, **kwargs):
        with terminate_as_interrupt():
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as exc:
                _exit_interrupted(exc)
            except Exception as exc:
                # CI: Ctrl-C at start-up, before a run exists, raised our KeyboardInterrupt inside a pydantic
                # serializer, which wrapped it in PydanticSerializationError (exit 1). After our handler ran any
                # error is the interrupt's consequence; the flag is checked, not Prefect (not imported yet)
                if not (_interrupted.is_set() or any(isinstance(e, KeyboardInterrupt) for e in _chain(exc))):
                    raise
                _exit_interrupted(exc)

    return run


def _exit_interrupted(exc: BaseException) -> None:
    """The one `error:` line of an interrupt, the local cluster stopped, then exit 130."""
    ignore_further_interrupts()  # first: a resent or second signal must not cut the message short
    _pending.clear()
    message = str(exc) if isinstance(exc, Interrupted) else "interrupted; nothing was recorded yet"
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    from flows.boot import stop_after_interrupt  # imports nothing heavy

    stop_after_interrupt()  # a local cluster no run took yet (the interrupt came first)
    ignore_interrupts_to_exit()
    raise typer.Exit(EXIT_INTERRUPTED) from None
