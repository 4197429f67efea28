"""One ``error:`` line for every failure that reaches the command line; its traceback goes to a log file.

Commands report the failures they anticipate (bad input, a refused query, a failed quality gate) with their
own ``error:`` lines and ``typer.Exit``. Anything else that escapes a command, a library's exception or a
bug of ours, is reported here, in one place: :class:`ReportingGroup`, the click group every command hangs
from, prints one line naming the command, its input as typed, the exception and what to do, writes the full
traceback to a log file of its own (:func:`log_dir`: the per-user cache folder's ``normaudit/logs``), names
that file in the line, and exits 1. ``--verbose`` prints the traceback above the line too.

Only typer's public API: the group class (``cls``), and its click methods ``resolve_command`` and ``make_context``.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import platform
import re
import shlex
import sys
import tempfile
import traceback
from importlib import metadata
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

LOGS_KEPT = 100  # the newest error logs; older ones are removed when a new one is written
_MESSAGE_CHARS = 400  # of the exception's message on the line; the log holds all of it
_POINTER = re.compile(r"\s*\^+\s*")  # a line that only points at a column of the line above it
_RESOLVED = "normaudit.resolved"  # ctx.meta key: the (name, command, args) of each level of the command line

# Exceptions that already are the CLI's answer: exit codes, and usage errors (typer's click exceptions all
# derive from TyperException). A closed pipe (``normaudit sql ... | head``) also goes on: typer handles it.
_PASS_THROUGH = (typer.TyperException, typer.Exit, typer.Abort)

# Every command has --verbose; this handler reads it (the command itself may not).
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", help="print the traceback of an unexpected failure (always written to the log file its "
                      "error line names)")]


class ReportingGroup(TyperGroup):
    """A typer group that turns an exception escaping any of its commands into one ``error:`` line, exit 1."""

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        # meta is shared by the whole context chain: a nested group (``theory``) appends the leaf below it
        ctx.meta.setdefault(_RESOLVED, []).append((name, command, list(rest)))
        return name, command, rest

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise
            report_failure(ctx, exc)
        except Exception as exc:  # noqa: BLE001 - reported in full (log file), never swallowed
            report_failure(ctx, exc)
        raise typer.Exit(1)


def log_dir() -> Path:
    """Where error logs go: ``normaudit/logs`` in the per-user cache folder (``$XDG_CACHE_HOME``, ``~/.cache``)."""
    # imported here, not at the top: pydantic-settings costs every command's start, and only a failure needs it
    from pipeline.settings import user_cache_dir

    return Path(user_cache_dir()) / "logs"


def report_failure(ctx: typer.Context, exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to a new log file and print the one ``error:`` line; return the file."""
    resolved = ctx.meta.get(_RESOLVED, [])
    names = [name for name, _, _ in resolved if name]
    args = resolved[-1][2] if resolved else []
    leaf = resolved[-1][1] if resolved else None
    has_verbose = leaf is not None and any(p.name == "verbose" for p in leaf.params)
    command = " ".join([ctx.find_root().info_name or "normaudit", *names])
    log = write_log(command, args, exc)
    if has_verbose and _parsed(ctx, resolved).get("verbose"):
        traceback.print_exception(exc, file=sys.stderr)
    typer.secho(failure_line(command, args, exc, log, has_verbose), fg=typer.colors.RED, err=True)
    return log


def failure_line(command: str, args: list[str], exc: BaseException, log: Path | None, has_verbose: bool) -> str:
    """``error: <command> failed on <its arguments>: <exception>. <what to do>; <where the traceback is>``."""
    given = f" on {shlex.join(args)}" if args else ""
    kind = type(exc).__qualname__
    package = type(exc).__module__.split(".")[0].lstrip("_")  # the library's name (duckdb, not _duckdb)
    if package and package != "builtins":
        kind = f"{package}.{kind}"
    message = one_line(str(exc)).rstrip(".")
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS - 1] + "…"
    todo = "Check that path and its permissions" if isinstance(exc, OSError) else "Check the input it names"
    if log is None:
        where = "no log file could be written (the traceback is above)"
    else:
        where = f"the traceback is in {log}" + (" (--verbose prints it)" if has_verbose else "")
    return (f"error: {command} failed{given}: {kind}" + (f": {message}" if message else "")
            + f". {todo}; {where}; if the input is right, please report it with that file.")


def one_line(text: str) -> str:
    """``text`` on one line, without the lines that only point into a quoted source (SQL's ``LINE 1: ...``
    and a YAML or SQL caret line ``^^^``): their context is in the log."""
    lines = text.splitlines()
    kept = [ln for i, ln in enumerate(lines) if not _POINTER.fullmatch(ln)
            and not (ln.startswith("LINE ") and i + 1 < len(lines) and _POINTER.fullmatch(lines[i + 1]))]
    return " ".join(" ".join(kept).split())


def write_log(command: str, args: list[str], exc: BaseException) -> Path | None:
    """A new log file holding the command line and ``exc``'s full traceback; None if none could be written.

    One file per failed invocation (timestamp, command and process id in its name), in :func:`log_dir`, else
    in the temporary folder; the oldest are removed beyond :data:`LOGS_KEPT`.
    """
    stamp = dt.datetime.now().astimezone()
    name = f"normaudit-{stamp:%Y%m%dT%H%M%S}-{command.split()[-1]}-{os.getpid()}.log"
    text = (f"time: {stamp.isoformat(timespec='seconds')}\n"
            f"command: {shlex.join([*command.split(), *args])}\n"
            f"cwd: {os.getcwd()}\n"
            f"normaudit {_version('normaudit')}, python {platform.python_version()}, {platform.platform()}\n"
            f"raised by {_library(exc)}\n\n" + "".join(traceback.format_exception(exc)))
    for folder in (log_dir, lambda: Path(tempfile.gettempdir()) / "normaudit-logs"):
        try:  # the report must not fail on a second problem (an unreadable setting, a full disk)
            folder = folder()
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(text)
        except OSError:
            continue
        _prune(folder)
        return path
    traceback.print_exception(exc, file=sys.stderr)  # nowhere to write it: the traceback goes to the terminal
    return None


def _prune(folder: Path) -> None:
    logs = sorted(folder.glob("normaudit-*.log"), key=lambda p: p.stat().st_mtime)
    for old in logs[:-LOGS_KEPT]:
        old.unlink(missing_ok=True)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _library(exc: BaseException) -> str:
    """The distribution (and its version) whose module defines the exception's type, when it is a library's."""
    top = type(exc).__module__.split(".")[0]
    if top in ("builtins", "__main__"):
        return "Python (a built-in exception)"
    try:  # a C extension may sit beside its package under a private name (_duckdb)
        found = metadata.packages_distributions()
        dists = found.get(top) or found.get(top.lstrip("_"), [])
    except Exception:  # noqa: BLE001 - a broken distribution's metadata must not hide the failure itself
        dists = []
    return ", ".join(f"{d} {_version(d)}" for d in dists) or top


def _parsed(ctx: typer.Context, resolved: list) -> dict:
    """The leaf command's parameters, parsed again from its arguments (no callbacks run); {} if they do not parse."""
    if not resolved:
        return {}
    name, command, args = resolved[-1]
    try:
        with command.make_context(name, list(args), parent=ctx, resilient_parsing=True) as leaf:
            return dict(leaf.params)
    except Exception:  # noqa: BLE001 - the report must not fail on a second problem
        return {}
