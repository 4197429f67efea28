"""The claims table as the audit's summary prints it: one row per test, grouped by claim with its verdict."""

from __future__ import annotations

import polars as pl
from rich.table import Table


def _number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def claims_rich_table(claims: pl.DataFrame, title: str) -> Table:
    """A rich table of ``claims`` (:data:`pipeline.analysis.claims.CLAIM_COLUMNS`)."""
    table = Table(title=title, caption="verdict rule and populations: docs/analyses.md, 'The claims table'")
    for col, justify in (("claim", "left"), ("verdict", "left"), ("population", "left"), ("statistic", "left"),
                         ("value", "right"), ("95% CI", "right"), ("n", "right"), ("p (Holm)", "right"),
                         ("evidence", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for row in claims.iter_rows(named=True):
        ci = "—" if row["ci_low"] is None else f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
        table.add_row(row["claim"], row["verdict"], row["population"],
                      f"{row['statistic']} ({row['direction']} vs {row['null_value']:g})", _number(row["value"]), ci,
                      f"{row['n']:,}", "—" if row["p_holm"] is None else f"{row['p_holm']:.3g}", row["evidence"])
    return table
