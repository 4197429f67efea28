"""The audit's analyses: which SQL files an audit runs, with their CIs, as ``results`` rows."""

from __future__ import annotations

import duckdb
import polars as pl

from pipeline.analysis.replicates import POISSON
from pipeline.analysis.retrieval import register_retrieval_tables
from pipeline.analysis.retrieval_intervals import SIGNAL_COLUMNS, stage_retrieval_replicates
from pipeline.analysis.sql import DEFAULT_PARAMS, forget_staged, record_staged, run_query, staged_for
from pipeline.analysis.token_intervals import token_intervals

# n_resamples and ci_method: the bootstrap's replicates behind an interval and the method that made it
# (n_resamples null for an interval a query computes itself: hypernym_pairs' Wilson score interval, the
# normal-approximation intervals of the retrieval means); both null in results stored before they existed
RESULT_COLUMNS = [
    "run_id", "analysis", "model", "release", "probe_set", "property", "statistic",
    "value", "ci_low", "ci_high", "n", "n_resamples", "ci_method",
]
# Analyses an audit runs after embedding, in order. Each produces no rows where the stored data lacks
# what it needs (no hypernym relations, no token table, no retrieval probe set).
AUDIT_ANALYSES = [
    "norm_vs_property", "norm_by_bin", "hypernym_pairs", "token_norm_vs_frequency",
    "retrieval_calibration", "retrieval_signals", "norm_rescoring",
]
# Companion queries whose ci_low/ci_high are joined onto an analysis's rows
# by (probe_set, property, statistic).
CI_QUERIES = {"norm_vs_property": "norm_vs_property_ci"}
# Analyses reading the tables the retrieval search registers on the connection (pipeline/analysis/retrieval.py).
RETRIEVAL_ANALYSES = frozenset({"retrieval_calibration", "retrieval_signals", "norm_rescoring"})
# Analyses computed in Python (no SQL file): their rows come from the query-level bootstrap
PYTHON_ANALYSES = frozenset({"retrieval_signals"})
# ci_method of the intervals a query computes itself
QUERY_CI_METHODS = {"hypernym_pairs": "wilson score", "norm_rescoring": "normal approximation"}
# the temporary table of retrieval_signals' rows, staged with the retrieval replicates
SIGNALS_TABLE = "stg_retrieval_signals"
_CI_KEYS = ["probe_set", "property", "statistic"]


def to_results(frame: pl.DataFrame, run_id: str, analysis: str) -> pl.DataFrame:
    """Shape a query's output as ``results`` rows (missing CI columns become null)."""
    out = frame.with_columns(pl.lit(run_id).alias("run_id"), pl.lit(analysis).alias("analysis"))
    for col, dtype in (("ci_low", pl.Float64), ("ci_high", pl.Float64), ("n_resamples", pl.Int64),
                       ("ci_method", pl.String)):
        if col not in out.columns:
            out = out.with_columns(pl.lit(None, dtype=dtype).alias(col))
    return out.select(RESULT_COLUMNS).with_columns(
        pl.col("value").cast(pl.Float64),
        pl.col("ci_low").cast(pl.Float64),
        pl.col("ci_high").cast(pl.Float64),
        pl.col("n").cast(pl.Int64), pl.col("property").cast(pl.String),
        pl.col("n_resamples").cast(pl.Int64), pl.col("ci_method").cast(pl.String),
    )


def ensure_retrieval_tables(con: duckdb.DuckDBPyConnection, model: str, release: str) -> None:
    """Run the retrieval search once per connection and release; later calls reuse its tables."""
    if staged_for(con, "retrieval") == (model, release, None):
        return
    register_retrieval_tables(con, model, release)
    record_staged(con, "retrieval", model, release)
    forget_staged(con, SIGNALS_TABLE)


def ensure_retrieval_intervals(con: duckdb.DuckDBPyConnection, model: str, release: str, seed: int,
                               resamples: int, **_: object) -> pl.DataFrame:
    """The query-level bootstrap of every retrieval set (:mod:`pipeline.analysis.retrieval_intervals`), once
    per connection, release, seed and resamples: returns the intervals of ``retrieval_calibration``'s rows and
    stages ``retrieval_signals``' rows as :data:`SIGNALS_TABLE`."""
    ensure_retrieval_tables(con, model, release)
    scope = f"seed={seed} resamples={resamples}"
    if staged_for(con, SIGNALS_TABLE) != (model, release, scope):
        intervals, signals = stage_retrieval_replicates(con, seed, resamples)
        con.register("retrieval_intervals_input", intervals)
        con.register("retrieval_signals_input", signals)
        try:
            con.execute("create or replace temp table stg_retrieval_intervals as "
                        "select * from retrieval_intervals_input")
            con.execute(f"create or replace temp table {SIGNALS_TABLE} as select * from retrieval_signals_input")
        finally:
            con.unregister("retrieval_intervals_input")
            con.unregister("retrieval_signals_input")
        record_staged(con, SIGNALS_TABLE, model, release, scope)
    return con.sql("select * from stg_retrieval_intervals").pl()


def run_analysis(con: duckdb.DuckDBPyConnection, name: str, model: str, release: str, run_id: str,
                 **params) -> pl.DataFrame:
    """One audit analysis as ``results`` rows: its query, with CIs from its companion query if any.

    Args:
        con: a catalog connection (``pipeline.storage.catalog.open_catalog``).
        name: an entry of :data:`AUDIT_ANALYSES` (any results-shaped query of ``sql/`` works).
        model, release: what to analyse.
        run_id: the run the rows are recorded under.
        **params: overrides of :data:`DEFAULT_PARAMS` (e.g. ``resamples=200``).

    Returns:
        The rows in :data:`RESULT_COLUMNS`; empty when the stored data lacks what the analysis needs.
    """
    bound = {**DEFAULT_PARAMS, **params, "model": model, "release": release}
    if name in RETRIEVAL_ANALYSES:
        ensure_retrieval_tables(con, model, release)
    if name in PYTHON_ANALYSES or name == "retrieval_calibration":  # both read the query-level bootstrap
        ensure_retrieval_intervals(con, **bound)
    if name in PYTHON_ANALYSES:
        frame = con.sql(f"select * from {SIGNALS_TABLE}").pl().cast(SIGNAL_COLUMNS)
    else:
        frame = run_query(con, name, **bound)
    if name in QUERY_CI_METHODS and frame.height:
        # the query's own intervals (where it computes one) name their method
        frame = frame.with_columns(
            pl.when(pl.col("ci_low").is_not_null()).then(pl.lit(QUERY_CI_METHODS[name]))
            .otherwise(pl.lit(None, dtype=pl.String)).alias("ci_method"),
            pl.lit(None, dtype=pl.Int64).alias("n_resamples"))
    ci = None
    if name in CI_QUERIES and frame.height:
        ci = run_query(con, CI_QUERIES[name], **bound)
    elif name == "token_norm_vs_frequency" and frame.height:
        ci = token_intervals(con, bound["seed"], bound["resamples"])
    if ci is not None:
        frame = _fill_intervals(frame, ci.select([*_CI_KEYS, "ci_low", "ci_high", "n_resamples", "ci_method"]))
    for col, value in (("model", model), ("release", release)):
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(value, dtype=pl.String).alias(col))
    return to_results(frame, run_id, name)


def _fill_intervals(frame: pl.DataFrame, ci: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the intervals of ``ci`` where it has none of its own (matched by :data:`_CI_KEYS`)."""
    if "ci_low" not in frame.columns:
        return frame.join(ci, on=_CI_KEYS, how="left")
    own = ["ci_low", "ci_high", "n_resamples", "ci_method"]
    for col, dtype in (("n_resamples", pl.Int64), ("ci_method", pl.String)):
        if col not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(col))
    joined = frame.join(ci.rename({c: f"{c}_boot" for c in own}), on=_CI_KEYS, how="left")
    has_own = pl.col("ci_low").is_not_null()
    return joined.with_columns(
        [pl.when(has_own).then(pl.col(c)).otherwise(pl.col(f"{c}_boot")).alias(c) for c in own]
    ).drop([f"{c}_boot" for c in own])


def interval_note(results: pl.DataFrame, params: dict | None = None) -> str:
    """One line naming the methods behind norm_vs_property's intervals in ``results`` (rows of
    :func:`run_analysis`) and the switch-over between them, for the audit's printed summary, e.g.
    ``intervals: m-out-of-n bootstrap (m=65536, rescaled by sqrt(m/n)) above n=250000 items: 4 of 12 rows;
    poisson bootstrap, 1000 resamples, below``. ``params``: the overrides the analyses ran with, if any."""
    bound = {**DEFAULT_PARAMS, **(params or {})}
    rows = results.filter(pl.col("analysis") == "norm_vs_property") if "analysis" in results.columns else results
    methods = rows["ci_method"].drop_nulls() if "ci_method" in rows.columns else pl.Series([], dtype=pl.String)
    switched = int((methods != POISSON).sum())
    large = (f"m-out-of-n bootstrap (m={bound['bootstrap_m']}, rescaled by sqrt(m/n)) above "
             f"n={bound['bootstrap_switch_n']} items")
    poisson = f"{POISSON}, {bound['resamples']} resamples"
    if not switched:
        return f"intervals: {poisson}; {large}: none here"
    return f"intervals: {large}: {switched} of {len(methods)} rows; {poisson}, below"
