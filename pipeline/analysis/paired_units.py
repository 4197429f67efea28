"""Paired bootstrap of the unit-level analyses: hypernym_pairs, retrieval_calibration, token_norm_vs_frequency.

Each analysis's units (pairs, queries, matched words) are written per side into a temporary table
``paired_<analysis>_units``, marked shared or not, each shared unit with its 0-based position among its probe
set's shared units ordered by key (``sql/paired_positions.sql``). The statistics are then computed in
``sql/paired_<analysis>.sql`` on weighted resamples read from ``paired_weights``: once with every weight 1
(the point values, replicate -1) and once per batch of replicates, whose weights ``sql/paired_weights.sql``
draws as the audit's bootstrap does. Units one side has alone are only counted.
"""

from __future__ import annotations

import duckdb

from pipeline.analysis.retrieval import register_retrieval_tables
from pipeline.analysis.sql import bind_params, ensure_staged_of, load_sql, stage_replicate_keys
from pipeline.progress import reporter

# (analysis, the query of one side's units or None where Python registers them, the query of its statistics).
# A units query reads the audit's staged tables of that analysis (sql/stg_*.sql), built per side.
UNIT_ANALYSES = (
    ("hypernym_pairs", "paired_hypernym_units", "paired_hypernym_pairs"),
    ("token_norm_vs_frequency", "paired_token_units", "paired_token_norm_vs_frequency"),
    ("retrieval_calibration", None, "paired_retrieval_calibration"),
)
# Most (unit row x replicate) pairs one batch of replicates expands at once; the queries expand each row
# into w copies (about one on average) and retrieval's into 8 signal x outcome rows more.
BATCH_UNIT_ROWS = 4_000_000


def side_params(base: tuple[str, str], other: tuple[str, str]) -> dict[str, str]:
    """The SQL parameters naming both sides of a comparison."""
    return {"base_model": base[0], "base_release": base[1], "other_model": other[0], "other_release": other[1]}


def sides(base: tuple[str, str], other: tuple[str, str]) -> list[tuple[int, tuple[str, str]]]:
    """(side number, (model, release)) to compute; a side compared with itself is computed once and copied
    (:func:`mirror_self`), so its differences are exactly 0 whatever the order of parallel float sums."""
    return [(0, base)] if base == other else [(0, base), (1, other)]


def mirror_self(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str],
                analysis: str) -> None:
    """Where base is other, copy side 0's rows of ``analysis`` to side 1."""
    if base != other:
        return
    for table in ("paired_points", "paired_replicates"):
        con.execute(f"insert into {table} select * replace (1::utinyint as side) from {table} "
                    "where side = 0 and analysis = $a", {"a": analysis})


def _execute(con: duckdb.DuckDBPyConnection, prefix: str, name: str, params: dict) -> None:
    """``prefix`` followed by ``(sql/<name>.sql)``, e.g. ``insert into t select * from``; parameters bound by name."""
    sql = load_sql(name)
    con.execute(f"{prefix} ({sql})", bind_params(sql, params))


def register_retrieval_units(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str]) -> None:
    """Each side's scored queries (alpha = 0) as ``paired_retrieval_calibration_raw``; run while the
    connection's ``embeddings`` holds the shared items only, so both sides search the same corpus."""
    con.execute("create or replace temp table paired_retrieval_calibration_raw (side utinyint, probe_set varchar, "
                "unit varchar, success_at_1 double, success_at_10 double, ndcg_at_10 double, query_norm double, "
                "top1_cosine double, top1_margin double, query_n_tokens double)")
    for side, (model, release) in sides(base, other):
        register_retrieval_tables(con, model, release)
        con.execute("insert into paired_retrieval_calibration_raw select $side, probe_set, query_id, success_at_1, "
                    "success_at_10, ndcg_at_10, query_norm, top1_score, margin, query_n_tokens "
                    "from retrieval_queries where alpha = 0", {"side": side})


def compare_units(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str],
                  bound: dict) -> None:
    """Fill ``paired_points``, ``paired_replicates`` and ``paired_counts`` for the unit-level analyses
    (after :func:`register_retrieval_units`), and ``paired_counts`` for norm_vs_property too; run while
    ``embeddings`` is the catalog's whole view."""
    params = {**bound, **side_params(base, other)}
    for analysis, units_query, stats_query in UNIT_ANALYSES:
        reporter().step(analysis)
        raw = f"paired_{analysis}_raw"
        if units_query:
            _side_units(con, raw, units_query, base, other, params)
        table = f"paired_{analysis}_units"
        _execute(con, f"create or replace temp table {table} as select * from", "paired_positions",
                 {"units": raw, "n_sides": len(sides(base, other))})
        if units_query:
            _execute(con, "insert into paired_counts select * from", "paired_side_counts",
                     {"units": table, "analysis": analysis})
        _bootstrap(con, table, stats_query, bound)
        mirror_self(con, base, other, analysis)
    # counted over the whole of both sides: the items one side embedded alone
    for counts in ("paired_unit_counts", "paired_retrieval_counts"):
        _execute(con, "insert into paired_counts select * from", counts, params)


def _side_units(con: duckdb.DuckDBPyConnection, raw: str, units_query: str, base: tuple[str, str],
                other: tuple[str, str], params: dict) -> None:
    """Each side's rows of ``units_query`` into temporary table ``raw``, its staged tables built for that side."""
    sql = load_sql(units_query)
    for side, (model, release) in sides(base, other):
        ensure_staged_of(con, sql, model, release)
        verb = f"create or replace temp table {raw} as" if side == 0 else f"insert into {raw}"
        _execute(con, f"{verb} select * from", units_query, {**params, "side": side})


def _bootstrap(con: duckdb.DuckDBPyConnection, table: str, stats_query: str, bound: dict) -> None:
    """The statistics of ``stats_query`` on the shared units of ``table``: point values, then every
    replicate in batches of at most :data:`BATCH_UNIT_ROWS` (unit row x replicate) pairs."""
    n_positions, n_rows = con.execute(f"select coalesce(max(pos) + 1, 0), count(*) filter (where shared) "
                                      f"from {table}").fetchone()
    if not n_positions:
        return
    columns = "side, analysis, probe_set, property, statistic"
    con.execute("create or replace temp table paired_weights as select -1::bigint as b, pos, 1::integer as w "
                "from range($n) as t(pos)", {"n": n_positions})
    _execute(con, f"insert into paired_points select {columns}, value, n from", stats_query, {})
    resamples = bound["resamples"]
    batch = max(1, min(resamples, min(BATCH_UNIT_ROWS, bound["bootstrap_batch_rows"]) // n_rows))
    for first in range(0, resamples, batch):
        stage_replicate_keys(con, bound["seed"], first, min(batch, resamples - first))
        _execute(con, "create or replace temp table paired_weights as select * from", "paired_weights",
                 {"n_positions": n_positions})
        _execute(con, f"insert into paired_replicates select {columns}, b, value from", stats_query, {})
