"""HTML building blocks of the reports: the page frame, tables, and statistics with their intervals."""

from __future__ import annotations

import datetime as dt
import html

import numpy as np
import polars as pl

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;
 margin:24px auto;
 padding:0 16px;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:4px}h2{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:.88em}
th,td{padding:4px 8px;border-bottom:1px solid #eee;
 text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{background:#f5f5f5}.muted{color:#666}
.alert{background:#fdecea;border-left:4px solid #d1495b;padding:8px 12px}
.ok{background:#eef7ee;border-left:4px solid #2e933c;padding:8px 12px}figure{margin:16px 0}
figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
details summary{cursor:pointer;color:#1b6ca8}
"""


class Html(str):
    """A table cell that is already HTML (not escaped again)."""


def fmt(value, ci_low=None, ci_high=None, digits: int = 3) -> Html:
    """A statistic with its sign, and its 95% interval in brackets when there is one."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return Html("—")
    text = f"{value:+.{digits}f}"
    if ci_low is not None and ci_high is not None:
        text += f" <span class='muted'>[{ci_low:+.{digits}f}, {ci_high:+.{digits}f}]</span>"
    return Html(text)


def table(data: pl.DataFrame | list[dict], columns: list[str] | None = None) -> str:
    """An HTML table of a frame or of row dicts (cells of type :class:`Html` are kept as they are)."""
    records = data.to_dicts() if isinstance(data, pl.DataFrame) else data
    columns = columns or (
        data.columns if isinstance(data, pl.DataFrame) else list(records[0]) if records else []
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    rows = []
    for row in records:
        cells = []
        for c in columns:
            v = row[c]
            if isinstance(v, Html):
                cells.append(f"<td class='num'>{v}</td>")
            elif isinstance(v, bool):
                cells.append(f"<td>{'yes' if v else 'no'}</td>")
            elif isinstance(v, float):
                cells.append(f"<td class='num'>{v:.4g}</td>" if np.isfinite(v) else "<td class='num'>—</td>")
            elif isinstance(v, int):
                cells.append(f"<td class='num'>{v:,}</td>")
            else:
                cells.append(f"<td>{html.escape('' if v is None else str(v))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def page(title: str, body: str) -> str:
    """A complete self-contained page: inline CSS, no scripts, no external assets."""
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
        f"<body>{body}<p class='muted'>rendered {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC by normaudit"
        "</p></body></html>"
    )
