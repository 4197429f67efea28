"""Paired comparison of two audited (model, release) sides on the units both embedded.

For every statistic of the compared analyses: its value on each side, computed on the shared units only,
the difference (other - base) and a paired bootstrap 95% interval of that difference. Both sides are
resampled with the same weights (a Poisson bootstrap seeded by (seed, replicate, unit position), as the
audit's own intervals: :mod:`pipeline.analysis.bootstrap`), so replicate b resamples the same units on both
sides and the interval is the 2.5/97.5% percentiles of the per-replicate differences. Units embedded by one
side only are counted (``n_only_base``, ``n_only_other``), never resampled.

norm_vs_property reuses the audit's staged tables and bootstrap, run over the shared items: while a side is
staged, the connection's ``embeddings`` is a temporary view of the shared items only (it shadows the
catalog's view of the same name; see :func:`shared_embeddings`). The other analyses resample their units in
``sql/paired_*.sql`` (:mod:`pipeline.analysis.paired_units`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import polars as pl

from pipeline.analysis.paired_units import (
    UNIT_ANALYSES,
    compare_units,
    mirror_self,
    register_retrieval_units,
    side_params,
    sides,
)
from pipeline.analysis.sql import (
    BOOTSTRAP,
    DEFAULT_PARAMS,
    STAGED_QUERIES,
    any_row_order,
    ensure_bootstrap_replicates,
    forget_staged,
    load_sql,
    run_query,
)
from pipeline.progress import reporter
from pipeline.storage.store import Store

PAIRED_COLUMNS = {
    "analysis": pl.String, "probe_set": pl.String, "property": pl.String, "statistic": pl.String,
    "base_model": pl.String, "base_release": pl.String, "model": pl.String, "release": pl.String,
    "base_value": pl.Float64, "value": pl.Float64, "difference": pl.Float64,
    "ci_low": pl.Float64, "ci_high": pl.Float64,
    "n_shared": pl.Int64, "n_only_base": pl.Int64, "n_only_other": pl.Int64, "n_resamples": pl.Int64,
    "verdict": pl.String,
}
# The staged scopes a paired comparison builds over shared items only: forgotten before and after, so no
# audit query on the same connection reads them as a whole release's.
_SHARED_STAGED = (*STAGED_QUERIES, BOOTSTRAP, "retrieval")
_INPUTS = {
    "paired_points": "side utinyint, analysis varchar, probe_set varchar, property varchar, statistic varchar, "
                     "value double, n bigint",
    "paired_replicates": "side utinyint, analysis varchar, probe_set varchar, property varchar, "
                         "statistic varchar, b bigint, value double",
    "paired_counts": "analysis varchar, probe_set varchar, property varchar, n_only_base bigint, "
                     "n_only_other bigint",
}


def paired_comparison(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str], *,
                      resamples: int = 1000, seed: int = DEFAULT_PARAMS["seed"], **params) -> pl.DataFrame:
    """Compare ``other`` with ``base`` on the units both embedded, with paired bootstrap intervals.

    Args:
        con: a catalog connection (``pipeline.storage.catalog.open_catalog``); its staged tables are rebuilt
            by the next audit query that needs them.
        base: (model, release) the difference is taken from (e.g. the previous release, or ``--against``).
        other: (model, release) compared with it.
        resamples: bootstrap replicates (at least 1).
        seed: bootstrap seed (0 <= seed < 2^32): the same data and seed give the same intervals.
        **params: overrides of :data:`~pipeline.analysis.sql.DEFAULT_PARAMS` (e.g. ``zipf_tolerance``,
            ``bootstrap_batch_rows``).

    Returns:
        One row per statistic either side defines, in :data:`PAIRED_COLUMNS`: ``difference = value -
        base_value``, both on the shared units; ``verdict`` 'differs' when the interval excludes 0, 'no
        evidence' when it contains 0, 'undefined' when there is none.
    """
    base, other = _side("base", base), _side("other", other)
    _require_embeddings(con, base, "base")
    _require_embeddings(con, other, "other")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples={resamples!r}: give a whole number of at least 1 (e.g. resamples=1000)")
    bound = {**DEFAULT_PARAMS, **params, "resamples": resamples, "seed": seed}
    for table, columns in _INPUTS.items():
        con.execute(f"create or replace temp table {table} ({columns})")
    progress = reporter()  # a step per side and analysis: the bootstraps take most of the time
    progress.begin_steps(f"comparing {'@'.join(other)} with {'@'.join(base)}",
                         len(sides(base, other)) + len(UNIT_ANALYSES) + 2)
    try:
        with shared_embeddings(con, base, other):
            _norm_vs_property(con, base, other, bound)
            progress.step("retrieval search")
            register_retrieval_units(con, base, other)
        compare_units(con, base, other, bound)
        progress.step("intervals")
        frame = run_query(con, "paired_comparison", **side_params(base, other))
    finally:
        progress.end_steps()
    return frame.select(list(PAIRED_COLUMNS)).cast(PAIRED_COLUMNS)


def _side(name: str, side: object) -> tuple[str, str]:
    if not (isinstance(side, tuple | list) and len(side) == 2 and all(isinstance(s, str) and s for s in side)):
        raise ValueError(f"{name}={side!r}: give a (model, release) pair of names, e.g. ('minilm', 'v1')")
    return side[0], side[1]


def _require_embeddings(con: duckdb.DuckDBPyConnection, side: tuple[str, str], name: str) -> None:
    found = con.execute("select count(*) from embeddings where model = $m and release = $r",
                        {"m": side[0], "r": side[1]}).fetchone()[0]
    if not found:
        audited = con.execute("select distinct model || ' ' || release from embeddings order by 1").fetchall()
        raise ValueError(
            f"{name}: no embeddings stored for model {side[0]!r} release {side[1]!r}; audit it first "
            f"(normaudit audit --model {side[0]} --release {side[1]}). Audited: {[a[0] for a in audited]}")


@contextmanager
def shared_embeddings(con: duckdb.DuckDBPyConnection, base: tuple[str, str],
                      other: tuple[str, str]) -> Iterator[None]:
    """Within the block, ``embeddings`` on ``con`` holds only the items both sides embedded.

    A temporary view shadows the catalog's ``embeddings`` (DuckDB resolves temporary objects first), so the
    audit's own staged tables and retrieval search run unchanged over the shared items. The staged scopes built
    inside are forgotten on leaving, and the view dropped: the connection is then as before.
    """
    database = con.execute("select current_database()").fetchone()[0]
    sides_sql = load_sql("paired_side_items")  # each side on its own, then intersected: each statement spills alone
    with any_row_order(con):  # sets of items: their order is no one's
        for table, (model, release) in (("paired_base_items", base), ("paired_other_items", other)):
            con.execute(f"create or replace temp table {table} as select * from ({sides_sql})",
                        {"model": model, "release": release})
        con.execute("create or replace temp table paired_shared_items as "
                    "select * from (" + load_sql("paired_shared_items") + ")")
    con.execute("drop table paired_base_items; drop table paired_other_items")
    forget_staged(con, *_SHARED_STAGED)
    quoted = '"' + database.replace('"', '""') + '"'
    # view DDL takes no parameters; the database name is quoted above
    con.execute(f"create or replace temp view embeddings as select e.* from {quoted}.main.embeddings as e "
                "semi join paired_shared_items as s on s.probe_set = e.probe_set and s.item_id = e.item_id")
    try:
        yield
    finally:
        con.execute("drop view if exists temp.main.embeddings")
        forget_staged(con, *_SHARED_STAGED)


def _norm_vs_property(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str],
                      bound: dict) -> None:
    """norm_vs_property on each side's shared items: the audit's query and bootstrap replicates."""
    for side, (model, release) in sides(base, other):
        reporter().step(f"norm_vs_property of {model}@{release}")
        params = {**bound, "model": model, "release": release}
        points = run_query(con, "norm_vs_property", **params)
        con.register("paired_input", points.to_arrow())
        con.execute("insert into paired_points select $side, 'norm_vs_property', probe_set, property, statistic, "
                    "value, n from paired_input", {"side": side})
        con.unregister("paired_input")
        ensure_bootstrap_replicates(con, **params)
        con.execute(f"insert into paired_replicates select $side, 'norm_vs_property', probe_set, property, "
                    f"statistic, b, value from {BOOTSTRAP}", {"side": side})
    mirror_self(con, base, other, "norm_vs_property")


def write_comparison(store: Store, run_id: str, frame: pl.DataFrame) -> None:
    """Store a comparison's rows as ``comparisons/<run_id>.parquet`` (the catalog's ``comparisons`` view);
    an empty frame writes nothing."""
    missing = set(PAIRED_COLUMNS) - set(frame.columns)
    if missing:
        raise ValueError(f"comparison rows lack {sorted(missing)}: write the frame paired_comparison returned")
    if frame.height:
        table = frame.with_columns(pl.lit(run_id).alias("run_id")).select(["run_id", *PAIRED_COLUMNS])
        store.write_table(f"comparisons/{run_id}.parquet", table.cast(PAIRED_COLUMNS).to_arrow())
