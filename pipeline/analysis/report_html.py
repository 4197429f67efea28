"""HTML of the reports: Jinja2 templates under ``templates/``, tables and statistics with their intervals.

Templates are autoescaped: every string that reaches a page (model, release, probe set, alert
message, table cell) is escaped unless it is :class:`Html`, markup this module built itself.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import jinja2
import numpy as np
import polars as pl
from markupsafe import Markup

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("pipeline.analysis", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt field fails the render instead of leaving a blank
    trim_blocks=True,
    lstrip_blocks=True,
)


class Html(Markup):
    """Markup built here (a statistic with its interval): kept as it is, never escaped again."""


@dataclass(frozen=True)
class Table:
    """A table ready for the ``table`` macro: headers, and rows of ``(css class or "", value)`` cells."""

    columns: list[str]
    rows: list[list[tuple[str, object]]]


def fmt(value, ci_low=None, ci_high=None, digits: int = 3) -> Html:
    """A statistic with its sign, and its 95% interval in brackets when there is one."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return Html("—")
    text = f"{value:+.{digits}f}"
    if ci_low is not None and ci_high is not None:
        text += f" <span class='muted'>[{ci_low:+.{digits}f}, {ci_high:+.{digits}f}]</span>"
    return Html(text)


def _cell(v) -> tuple[str, object]:
    if isinstance(v, Html):
        return "num", v
    if isinstance(v, bool):  # before int: bool is an int
        return "", "yes" if v else "no"
    if isinstance(v, float):
        return "num", f"{v:.4g}" if np.isfinite(v) else "—"
    if isinstance(v, int):
        return "num", f"{v:,}"
    return "", "" if v is None else str(v)


def table(data: pl.DataFrame | list[dict], columns: list[str] | None = None) -> Table:
    """A table of a frame or of row dicts (cells of type :class:`Html` are kept as they are)."""
    records = data.to_dicts() if isinstance(data, pl.DataFrame) else data
    columns = columns or (
        data.columns if isinstance(data, pl.DataFrame) else list(records[0]) if records else []
    )
    return Table(list(columns), [[_cell(row[c]) for c in columns] for row in records])


def render(template: str, **context) -> str:
    """A complete self-contained page from ``templates/<template>``: inline CSS, no scripts, no external assets."""
    return _ENV.get_template(template).render(rendered=f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}", **context)
