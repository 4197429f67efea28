"""How ``normaudit sql`` (and ``probes list``) print a result: table, CSV, JSON or Parquet, for every DuckDB type.

polars writes the text formats, and some DuckDB types have no form there: a BLOB in JSON panics inside polars
(a Rust backtrace), a MAP or UNION in CSV fails. :func:`printable` therefore turns those columns into strings in
DuckDB first (a BLOB as hex, the others as DuckDB's own text form), and :func:`write_output` reports whatever
polars still refuses as one ``error:`` line naming the column's type and what to do.
"""

from __future__ import annotations

import re
import shutil
import sys
from enum import StrEnum
from pathlib import Path

import typer

from pipeline.cli.table import MAX_ROWS, render


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


# DuckDB types (anywhere in a column's type, nested too) that polars cannot write as text: cast to VARCHAR
_NO_TEXT_FORM = re.compile(r"\b(BLOB|BIT|MAP|UNION|VARIANT)\b")
# ... and those it cannot hold at all (not even for Parquet)
_NO_POLARS_FORM = re.compile(r"\b(UNION|VARIANT)\b")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def printable(rel, format: OutputFormat):
    """``rel`` (a DuckDB relation) with the columns the format cannot carry as strings, the others as they are.

    A top-level BLOB becomes its hex digits (``'x'::blob`` → ``78``); BIT, MAP, UNION, VARIANT and any nested
    type holding one of them become DuckDB's text form of the value (``1::bit`` → ``000…01``, a map
    ``{1=2}``). Parquet keeps every type polars can write.
    """
    pattern = _NO_POLARS_FORM if format is OutputFormat.parquet else _NO_TEXT_FORM
    exprs, changed = [], False
    for name, dtype in zip(rel.columns, (str(t) for t in rel.types), strict=True):
        if not pattern.search(dtype):
            exprs.append(_quoted(name))
            continue
        changed = True
        if dtype == "BLOB":
            exprs.append(f"hex({_quoted(name)}) as {_quoted(name)}")
        else:
            exprs.append(f"{_quoted(name)}::varchar as {_quoted(name)}")
    return rel.project(", ".join(exprs)) if changed else rel


def write_output(table, format: OutputFormat, output: Path | None) -> None:
    """Write an Arrow table to ``output`` (else stdout) in ``format``; exit 1 with one ``error:`` line when polars
    cannot write one of its columns in that format."""
    import polars as pl  # a second to import: only when there is a result to write (the CLI starts fast)

    try:
        text = _render(table, format, output)
    except pl.exceptions.PolarsError as exc:
        # a type printable() does not know yet: one clear line, never polars' traceback
        typer.secho(f"error: the result cannot be written as {format.value}: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0]}. Cast that column in the query (e.g. col::varchar) or use another "
                    "--format.", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from exc
    if text is None:
        return
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


def _render(table, format: OutputFormat, output: Path | None) -> str | None:
    """The text of ``table`` in ``format``; a Parquet file is written to ``output`` here (None returned)."""
    import polars as pl  # a second to import: only when there is a result to write (the CLI starts fast)

    frame = pl.from_arrow(table)
    if format is OutputFormat.parquet:
        frame.write_parquet(output)
        typer.echo(f"wrote {frame.height} rows to {output}", err=True)
        return None
    if format is OutputFormat.csv:
        text = flatten_nested(frame).write_csv()
    elif format is OutputFormat.json:
        text = frame.write_json()
    else:
        text = table_text(frame)
    return text


def table_text(frame) -> str:
    """The table layout (:mod:`pipeline.cli.table`) for the terminal's width, with a hint when values were cut."""
    numeric = {c for c, t in frame.schema.items() if t.is_numeric()}
    # $COLUMNS first, then the terminal, else 80; a file gets the same layout as the screen would
    width = shutil.get_terminal_size().columns
    shown = render(frame.columns, frame.head(MAX_ROWS).rows(), frame.height, width, numeric)
    if shown.shortened:
        typer.echo("hint: values or rows were shortened to fit; --format csv or --format json prints them in full",
                   err=True)
    return shown.text


def flatten_nested(frame):
    """CSV has no nested types: write arrays/lists as JSON-style text."""
    import polars as pl  # a second to import: only when there is a result to write (the CLI starts fast)

    nested = [c for c, t in frame.schema.items() if isinstance(t, (pl.List, pl.Array, pl.Struct))]
    return frame.with_columns(
        [pl.col(c).map_elements(lambda v: str(list(v)) if v is not None else None, return_dtype=pl.String)
         for c in nested]
    )


