"""Run the SQL files of ``sql/`` by name with bound parameters (staged tables built on first use)."""

from __future__ import annotations

import operator
import re
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import polars as pl

from pipeline.analysis.bootstrap import MAX_M
from pipeline.analysis.replicates import stage_replicates
from pipeline.analysis.sql_files import bind_params, load_sql, sql_dir

__all__ = ["bind_params", "load_sql", "sql_dir"]  # their home is sql_files; importers of this module use them here

# Staged queries of the item-level analyses (norm_vs_property, norm_by_bin and the bootstrap replicates read them).
ANALYSIS_STAGED = ("stg_analysis_groups", "stg_analysis_values")
# Staged queries, materialized once per connection and scope for every query that names them. The units of
# hypernym_pairs and token_norm_vs_frequency are staged too: a paired comparison reads them per side.
STAGED_QUERIES = ("stg_analysis_scope", "stg_release_sets", *ANALYSIS_STAGED, "stg_hypernym_pairs",
                  "stg_token_words")
# Staged queries built in more than one statement: the tables named here are staged first (each its own SQL file)
# and dropped once the query that reads them is. One statement per step spills within the analyses' memory limit
# where the whole query in one did not: at 256MB, 10 M items in one statement, or 1 M with the string joins and
# the ranking of norms in one, failed.
STAGED_STEPS = {"stg_analysis_values": ("stg_analysis_positions", "stg_analysis_items")}
# Staged tables that several staged queries read (each names it in its SQL), dropped once all of those are staged
# for its scope: the release's one read of the embeddings view (~10 s at 10 M items) serves both.
SHARED_STAGED = {"stg_analysis_scope": ("stg_release_sets", "stg_analysis_values")}
# A comment of an SQL file, to its line's end: the tables a query reads are those its code names
_COMMENT = re.compile(r"--[^\n]*")
# Each batch's replicate keys (a paired comparison's weights): see stage_replicate_keys.
REPLICATE_KEYS = "bootstrap_replicate_keys"
# The bootstrap's replicate statistics (norm_vs_property_ci reads them), staged per (model, release, seed,
# resamples) in batches of replicates by pipeline/analysis/bootstrap.py: see ensure_bootstrap_replicates.
BOOTSTRAP = "stg_bootstrap_replicates"
# Parameters of the queries, bound where a query names them; callers may override any of them.
DEFAULT_PARAMS = {
    "resamples": 1000,  # bootstrap replicates of norm_vs_property_ci
    "seed": 20240607,  # bootstrap seed: the same data and seed give the same intervals
    "n_bins": 10,  # norm_by_bin: deciles
    "zipf_tolerance": 0.25,  # hypernym_pairs: frequency-matched pairs differ by at most this much zipf
    # bootstrap batches: at most this many (staged value row x replicate) pairs at once; within a batch the
    # replicates are computed in cache-sized chunks (pipeline/analysis/bootstrap.py), so memory hardly depends
    # on it. Measured (issue 19, benchmarks/bootstrap_scale.py): 1 M items x 3 properties, 0.94 GiB process peak
    # with DuckDB's staged rows, for 100 replicates as for 1,000
    "bootstrap_batch_rows": 100_000_000,
    # norm_vs_property_ci: samples of more than this many items get the m-out-of-n bootstrap, with this many
    # draws a replicate (pipeline/analysis/bootstrap.py). Why these: docs/analyses.md, "Large samples"
    "bootstrap_switch_n": 250_000,
    "bootstrap_m": 65_536,
}


def ensure_staged(con: duckdb.DuckDBPyConnection, name: str, model: str, release: str) -> None:
    """Materialize staged query ``sql/<name>.sql`` as a temporary table ``name`` for one scope.

    Once per connection and (model, release): the analyses that read it then share one string join
    and one sort of item ids. A query with steps (:data:`STAGED_STEPS`) stages them first, one statement each,
    and drops them after; a staged table several queries read (:data:`SHARED_STAGED`) is dropped once they all are
    staged. Open a new catalog after committing more data (a catalog is a snapshot).
    """
    if staged_for(con, name) == (model, release, None):
        return
    steps = STAGED_STEPS.get(name, ())
    for table in (*steps, name):  # the staged tables its statements read, for the same scope, first
        ensure_staged_of(con, load_sql(table), model, release, skip=(*steps, name))
    with any_row_order(con):
        for table in (*steps, name):
            sql = load_sql(table)
            con.execute(f"create or replace temp table {table} as {sql}",
                        bind_params(sql, {"model": model, "release": release}))
        for table in steps:  # read once, by ``name``: its rows need not outlive it (nor fill the spill folder)
            con.execute(f"drop table {table}")
    record_staged(con, name, model, release)
    done = (model, release, None)
    for shared, readers in SHARED_STAGED.items():  # nor those of a table every reader of which is now staged
        if name in readers and staged_for(con, shared) == done and all(staged_for(con, r) == done for r in readers):
            con.execute(f"drop table {shared}")
            forget_staged(con, shared)


@contextmanager
def any_row_order(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Let DuckDB keep rows in any order inside: a staged table (queries order their output) is then
    written in parallel, about three times cheaper. The connection's own setting is restored after."""
    keep = con.execute("select current_setting('preserve_insertion_order')").fetchall()[0][0]
    con.execute("set preserve_insertion_order = false")
    try:
        yield
    finally:
        con.execute(f"set preserve_insertion_order = {'true' if keep else 'false'}")


def ensure_bootstrap_replicates(con: duckdb.DuckDBPyConnection, model: str, release: str, resamples: int,
                                seed: int, bootstrap_batch_rows: int = DEFAULT_PARAMS["bootstrap_batch_rows"],
                                bootstrap_switch_n: int = DEFAULT_PARAMS["bootstrap_switch_n"],
                                bootstrap_m: int = DEFAULT_PARAMS["bootstrap_m"], **_: object) -> None:
    """Stage the bootstrap replicates of norm_vs_property (:mod:`pipeline.analysis.bootstrap`, which defines
    the method) as temporary table :data:`BOOTSTRAP`, from the staged :data:`ANALYSIS_STAGED` tables.

    Once per connection and (model, release, seed, resamples, switch-over, m), in batches of replicates: a
    batch holds at most ``bootstrap_batch_rows`` (staged value row x replicate) pairs, so memory stays bounded
    however many items and replicates there are. Replicate b's weights (or draws) depend on (seed, b) alone:
    the statistics do not depend on the batching. Samples of more than ``bootstrap_switch_n`` items get the
    m-out-of-n bootstrap with ``bootstrap_m`` draws a replicate.
    """
    resamples = _at_least_one("resamples", resamples, "1000")
    bootstrap_batch_rows = _at_least_one("bootstrap_batch_rows", bootstrap_batch_rows, "100_000_000")
    switch_n = _at_least_one("bootstrap_switch_n", bootstrap_switch_n, "250_000")
    m = _at_least_one("bootstrap_m", bootstrap_m, "65_536")
    if m > MAX_M:
        raise ValueError(f"bootstrap_m={bootstrap_m!r}: give at most {MAX_M:_} draws (e.g. bootstrap_m=65_536)")
    scope = f"seed={seed} resamples={resamples} switch_n={switch_n} m={m}"
    if staged_for(con, BOOTSTRAP) == (model, release, scope):
        return
    for table in ANALYSIS_STAGED:
        ensure_staged(con, table, model, release)
    value_rows = con.execute("select count(*) from stg_analysis_values").fetchone()[0]
    batch = max(1, min(resamples, bootstrap_batch_rows // max(value_rows, 1)))
    stage_replicates(con, BOOTSTRAP, seed, resamples, batch, switch_n=switch_n, m=m)
    record_staged(con, BOOTSTRAP, model, release, scope)


def stage_replicate_keys(con: duckdb.DuckDBPyConnection, seed: int, first_resample: int,
                         batch_resamples: int) -> None:
    """Stage ``sql/bootstrap_replicate_keys.sql`` as a temporary table of that name for replicates
    ``first_resample`` .. ``first_resample + batch_resamples - 1``: the keys their weights are hashed from."""
    sql = load_sql(REPLICATE_KEYS)
    params = {"seed": seed, "first_resample": first_resample, "batch_resamples": batch_resamples}
    con.execute(f"create or replace temp table {REPLICATE_KEYS} as {sql}", bind_params(sql, params))


def ensure_staged_of(con: duckdb.DuckDBPyConnection, sql: str, model: str, release: str,
                     skip: tuple[str, ...] = ()) -> None:
    """Build the staged tables (:data:`STAGED_QUERIES`) that query text ``sql`` reads (outside its comments), for
    ``model`` and ``release``; none of ``skip``."""
    code = _COMMENT.sub("", sql)
    for table in STAGED_QUERIES:
        if table not in skip and re.search(rf"\b{table}\b", code):
            ensure_staged(con, table, model, release)


def _at_least_one(name: str, value: object, example: str) -> int:
    try:
        whole = operator.index(value)
    except TypeError:
        whole = 0
    if isinstance(value, bool) or whole < 1:
        raise ValueError(f"{name}={value!r}: give a whole number of at least 1 (e.g. {name}={example})")
    return whole


def staged_for(con: duckdb.DuckDBPyConnection, name: str) -> tuple[str, str, str | None] | None:
    """What this connection's temporary tables ``name`` were built for, if any: (model, release, the
    scope's other parameters or None)."""
    con.execute("create temp table if not exists staged_scopes "
                "(name varchar, model varchar, release varchar, detail varchar)")
    rows = con.execute("select model, release, detail from staged_scopes where name = $name",
                       {"name": name}).fetchall()
    return rows[0] if rows else None


def record_staged(con: duckdb.DuckDBPyConnection, name: str, model: str, release: str,
                   detail: str | None = None) -> None:
    con.execute("delete from staged_scopes where name = $name", {"name": name})
    con.execute("insert into staged_scopes values ($name, $model, $release, $detail)",
                {"name": name, "model": model, "release": release, "detail": detail})


def forget_staged(con: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Make the next query that needs staged tables ``names`` build it again (their tables are left to be replaced):
    for code that staged them over other rows than the scope says, such as a paired comparison's shared items."""
    for name in names:
        if staged_for(con, name) is not None:
            con.execute("delete from staged_scopes where name = $name", {"name": name})


def run_query(con: duckdb.DuckDBPyConnection, name: str, **params) -> pl.DataFrame:
    """Execute ``sql/<name>.sql`` with parameters bound by name (``$model`` ← ``model=...``).

    A query reading a staged table (:data:`STAGED_QUERIES`) gets it built first for its ``model`` and ``release``;
    one reading the bootstrap replicates (:data:`BOOTSTRAP`) gets them for its ``resamples`` and ``seed`` too.
    """
    sql = _with_inputs(con, name, params)
    return con.sql(sql, params=bind_params(sql, params)).pl()


def empty_result(con: duckdb.DuckDBPyConnection, name: str, **params) -> pl.DataFrame:
    """``sql/<name>.sql``'s columns and types without its rows, its inputs built as :func:`run_query` builds them:
    DuckDB plans the query and reads no table, for a caller that knows the result is empty."""
    sql = _with_inputs(con, name, params)
    return con.sql(f"select * from ({sql}\n) limit 0", params=bind_params(sql, params)).pl()


def _with_inputs(con: duckdb.DuckDBPyConnection, name: str, params: dict) -> str:
    """The text of ``sql/<name>.sql``, after building the staged tables and bootstrap replicates it reads."""
    sql = load_sql(name)
    if any(re.search(rf"\b{table}\b", sql) for table in STAGED_QUERIES):
        ensure_staged_of(con, sql, params["model"], params["release"])
    if re.search(rf"\b{BOOTSTRAP}\b", sql):
        ensure_bootstrap_replicates(con, **params)
    return sql
