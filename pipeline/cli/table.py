"""Query results for a terminal: a table that fits its width, else one field per line.

Wide rows (``select * from results`` has eleven columns, run ids and messages) wrapped by the terminal
are unreadable, so each cell is kept to one line and shortened with an ellipsis, and a row that still
does not fit is printed vertically, one ``column │ value`` line per field. What was shortened is said
in one hint line that points to ``--format csv`` / ``--format json`` for the full values.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size

MAX_CELL = 40  # characters of one cell in the horizontal layout
MAX_ROWS = 50  # rows printed; the rest are counted in the footer
MIN_VALUE = 20  # narrowest value column of the vertical layout, whatever the terminal says
ELLIPSIS = "…"


@dataclass
class Rendered:
    """The text to print and what was left out of it, for the hint line."""

    text: str
    shortened: bool  # a cell lost characters or rows were left out
    vertical: bool


def fit(text: str, width: int) -> tuple[str, bool]:
    """``text`` cut to ``width`` terminal cells with a trailing ellipsis; True if it was cut."""
    if cell_len(text) <= width:
        return text, False
    return set_cell_size(text, max(width - 1, 0)).rstrip() + ELLIPSIS, True


def cell_text(value) -> str:
    """One line of text for a value: NULL, short floats, lists in brackets, control characters escaped."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(cell_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {cell_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    text = value.hex() if isinstance(value, bytes) else str(value)
    # one cell, one line: a newline inside a value would break the layout
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def render(columns: list[str], rows: list[tuple], total: int, width: int, numeric: set[str]) -> Rendered:
    """Lay out ``rows`` (at most :data:`MAX_ROWS` of ``total``) for a terminal ``width`` cells wide.

    Args:
        columns: column names, in order.
        rows: the rows to show, as tuples of Python values.
        total: how many rows the result has (rows beyond ``rows`` are only counted).
        width: terminal width in cells.
        numeric: columns to right-align.
    """
    cells = [[cell_text(v) for v in row] for row in rows]
    shortened = total > len(rows)
    if not cells:  # no rows: the column names, on one line
        names, cut = fit("columns: " + ", ".join(columns), max(width, MIN_VALUE))
        return Rendered(f"{names}\n(0 rows)\n", cut, False)
    horizontal, cut = _horizontal(columns, cells, numeric)
    if max((cell_len(line) for line in horizontal), default=0) <= width:
        lines, vertical, shortened = horizontal, False, shortened or cut
    else:
        lines, cut = _vertical(columns, cells, width)
        vertical, shortened = True, shortened or cut
    noun = "row" if total == 1 else "rows"
    lines.append(f"({total} {noun}" + (f", first {len(rows)} shown)" if total > len(rows) else ")"))
    return Rendered("\n".join(lines) + "\n", shortened, vertical)


def _horizontal(columns: list[str], cells: list[list[str]], numeric: set[str]) -> tuple[list[str], bool]:
    cut = False
    fitted = []
    for row in cells:
        out = []
        for text in row:
            short, was_cut = fit(text, MAX_CELL)
            cut |= was_cut
            out.append(short)
        fitted.append(out)
    heads = [fit(c, MAX_CELL)[0] for c in columns]
    widths = [max([cell_len(h), *(cell_len(r[i]) for r in fitted)]) for i, h in enumerate(heads)]

    def line(values: list[str]) -> str:
        parts = []
        for name, text, w in zip(columns, values, widths, strict=True):
            pad = " " * (w - cell_len(text))
            parts.append(pad + text if name in numeric else text + pad)
        return "  ".join(parts).rstrip()

    return [line(heads), "  ".join("-" * w for w in widths), *(line(r) for r in fitted)], cut


def _vertical(columns: list[str], cells: list[list[str]], width: int) -> tuple[list[str], bool]:
    label_w = min(max((cell_len(c) for c in columns), default=1), 24)
    value_w = max(width - label_w - 3, MIN_VALUE)
    cut = False
    lines: list[str] = []
    for n, row in enumerate(cells, 1):
        head = f"-[ row {n} ]"
        lines.append(head + "-" * max(min(width, label_w + 3 + value_w) - cell_len(head), 0))
        for name, text in zip(columns, row, strict=True):
            label, label_cut = fit(name, label_w)
            value, value_cut = fit(text, value_w)
            cut |= label_cut or value_cut
            lines.append((label + " " * (label_w - cell_len(label)) + " │ " + value).rstrip())
    return lines, cut
