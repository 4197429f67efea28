"""Run the SQL files of ``sql/`` by name with bound parameters, and turn them into ``results`` rows."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb
import polars as pl

RESULT_COLUMNS = [
    "run_id", "analysis", "model", "release", "probe_set", "property", "statistic", "value", "ci_low", "ci_high", "n",
]
# Analyses an audit runs after embedding, in order.
AUDIT_ANALYSES = ["norm_vs_property"]


def sql_dir() -> Path:
    """Where the .sql files live: inside the installed package, or the repository's ``sql/``."""
    packaged = resources.files("pipeline") / "sql"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "sql"


def load_sql(name: str) -> str:
    """The text of ``sql/<name>.sql``; a miss lists the queries that exist."""
    path = sql_dir() / f"{name}.sql"
    if not path.is_file():
        known = sorted(p.stem for p in sql_dir().glob("*.sql"))
        raise KeyError(f"no SQL query named {name!r} in {sql_dir()}; known: {known}")
    return path.read_text()


def run_query(con: duckdb.DuckDBPyConnection, name: str, **params) -> pl.DataFrame:
    """Execute ``sql/<name>.sql`` with parameters bound by name (``$model`` ← ``model=...``)."""
    sql = load_sql(name)
    used = {k: v for k, v in params.items() if f"${k}" in sql}
    return con.sql(sql, params=used).pl()


def to_results(frame: pl.DataFrame, run_id: str, analysis: str) -> pl.DataFrame:
    """Shape a query's output as ``results`` rows (missing CI columns become null)."""
    out = frame.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(analysis).alias("analysis"))
    for col, dtype in (("ci_low", pl.Float64), ("ci_high", pl.Float64)):
        if col not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dtype).alias(col))
    return out.select(RESULT_COLUMNS).with_columns(pl.col("value").cast(pl.Float64), pl.col("n").cast(pl.Int64))
