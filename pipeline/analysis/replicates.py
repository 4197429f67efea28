"""Stage the bootstrap replicates of norm_vs_property: each sample by its route, chunks of replicates on threads.

:mod:`pipeline.analysis.bootstrap` defines both routes and computes the Poisson bootstrap's replicates;
:mod:`pipeline.analysis.m_out_of_n` the m-out-of-n bootstrap's, for samples of more than ``switch_n`` items
(staged in DuckDB and never loaded whole).
:func:`stage_replicates` writes every replicate statistic into one temporary table (:data:`TABLE_SCHEMA`) with
the method that made it, from which ``sql/norm_vs_property_ci.sql`` takes its intervals and a paired comparison
its differences.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import polars as pl

from pipeline.analysis.bootstrap import (
    CHUNK_CELLS,
    Buffers,
    draw_positions,
    item_sets,
    replicate_keys,
    replicate_statistics,
    sample_specs,
    with_static,
)
from pipeline.analysis.m_out_of_n import (
    LOOKUP_BLOCK,
    LOOKUP_DRAWS,
    LargeSample,
    full_sample_values,
    gather,
    large_statistics,
    stage_large_sample,
)

TABLE_SCHEMA = "probe_set varchar, property varchar, statistic varchar, b bigint, value double, method varchar"
# the method column's label for the Poisson bootstrap (the m-out-of-n one's: m_out_of_n_method)
POISSON = "poisson bootstrap"


def m_out_of_n_method(m: int) -> str:
    """The method column's label for an m-out-of-n bootstrap of ``m`` draws a replicate."""
    return f"m-out-of-n bootstrap m={m}"


def stage_replicates(con: duckdb.DuckDBPyConnection, table: str, seed: int, resamples: int,
                     batch_resamples: int, threads: int | None = None, chunk_cells: int = CHUNK_CELLS,
                     switch_n: int | None = None, m: int | None = None, lookup_draws: int = LOOKUP_DRAWS,
                     lookup_block: int = LOOKUP_BLOCK) -> None:
    """Create temporary table ``table`` (:data:`TABLE_SCHEMA`) with the statistics of replicates
    0 .. ``resamples`` - 1 of every sample staged on ``con``, computed at most ``batch_resamples``
    replicates (and ``chunk_cells`` replicate x item cells, or x draws) at a time, chunks on ``threads``
    threads (default: the CPUs this process may use, at most 4): a replicate's values depend neither on the
    batching nor on the threads. Samples of more than ``switch_n`` items (None: none) are resampled by the
    m-out-of-n bootstrap with ``m`` draws a replicate (at most n), the others by the Poisson bootstrap; a large
    sample's draws are looked up ``lookup_draws`` at a time, ``lookup_block`` staged items per query
    (:mod:`pipeline.analysis.m_out_of_n`: memory stays bounded whatever n)."""
    if (switch_n is None) != (m is None):
        raise ValueError(f"switch_n={switch_n!r}, m={m!r}: give both (the m-out-of-n route) or neither")
    small, large = [], []
    for spec in sample_specs(con):
        (large if switch_n is not None and spec.n > switch_n else small).append(spec)
    sets = [with_static(s) for s in item_sets(con, small)]
    con.execute(f"create or replace temp table {table} ({TABLE_SCHEMA})")
    # numpy's array operations release the GIL, so chunks of replicates run in parallel on threads
    with ThreadPoolExecutor(max_workers=threads or min(4, len(os.sched_getaffinity(0)))) as pool:
        if sets:
            _stage_poisson(con, table, sets, seed, resamples, batch_resamples, chunk_cells, pool)
        full = full_sample_values(con) if large else {}
        for index, spec in enumerate(large):
            sample = stage_large_sample(con, spec, m, f"stg_m_out_of_n_{index}", full)
            try:
                _stage_m_out_of_n(con, table, sample, seed, resamples, chunk_cells, pool, lookup_draws, lookup_block)
            finally:
                con.execute(f"drop table if exists {sample.table}").fetchall()


def _stage_poisson(con: duckdb.DuckDBPyConnection, table: str, sets: list, seed: int, resamples: int,
                   batch_resamples: int, chunk_cells: int, pool: ThreadPoolExecutor) -> None:
    chunk = max(1, min(batch_resamples, chunk_cells // max(len(s.positions) for s in sets)))
    local = threading.local()

    def chunk_rows(start: int, count: int) -> list[tuple[tuple[str, str, str, str], np.ndarray, np.ndarray]]:
        if not hasattr(local, "buffers"):
            local.buffers = Buffers()
        keys = replicate_keys(seed, start, count)
        b = np.arange(start, start + count, dtype=np.int64)
        return [((sample.probe_set, sample.property, statistic, POISSON), value, b)
                for item_set in sets
                for sample, statistic, value in replicate_statistics(item_set, keys, local.buffers)]

    for first in range(0, resamples, batch_resamples):
        last = min(first + batch_resamples, resamples)
        starts = range(first, last, chunk)
        rows = [r for part in pool.map(chunk_rows, starts, [min(chunk, last - s) for s in starts]) for r in part]
        if rows:
            insert_replicates(con, table, ("probe_set", "property", "statistic", "b", "value", "method"), rows)


def _stage_m_out_of_n(con: duckdb.DuckDBPyConnection, table: str, sample: LargeSample, seed: int, resamples: int,
                      chunk_cells: int, pool: ThreadPoolExecutor, lookup_draws: int, lookup_block: int) -> None:
    """The replicates of one large sample: a pass looks up the draws of ``lookup_draws`` // m replicates, whose
    statistics are then computed in chunks of ``chunk_cells`` draws on the pool's threads."""
    per_pass = max(1, lookup_draws // sample.m)
    chunk = max(1, chunk_cells // sample.m)
    method = m_out_of_n_method(sample.m)
    for first in range(0, resamples, per_pass):
        count = min(per_pass, resamples - first)
        drawn = gather(con, sample, draw_positions(replicate_keys(seed, first, count), sample.m, sample.n),
                       lookup_block)

        def chunk_rows(start: int, drawn=drawn, first=first, count=count) -> list:
            rows = slice(start, min(start + chunk, count))
            b = np.arange(first + rows.start, first + rows.stop, dtype=np.int64)
            part = {c: v[rows] for c, v in drawn.items()}
            return [((sample.spec.probe_set, sample.spec.property, statistic, method), value, b)
                    for statistic, value in large_statistics(sample, part)]

        rows = [r for part in pool.map(chunk_rows, range(0, count, chunk)) for r in part]
        insert_replicates(con, table, ("probe_set", "property", "statistic", "b", "value", "method"), rows)


def insert_replicates(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...],
                      rows: list[tuple[tuple, np.ndarray, np.ndarray]]) -> None:
    """Append replicate statistics to ``table``, whose ``columns`` are in table order: ``b`` and ``value`` come from
    each row's arrays (values, replicate numbers), every other column from its name tuple, in that order."""
    # polars frames, not Arrow tables: DuckDB imports pandas (~0.7 s) to scan the latter, not the former. The
    # names are joined in by number: one string per (sample, statistic), not per replicate
    named = [c for c in columns if c not in ("b", "value")]
    names = pl.DataFrame([(i, *name) for i, (name, _, _) in enumerate(rows)], orient="row",
                         schema={"which": pl.Int32, **dict.fromkeys(named, pl.String)})
    values = pl.DataFrame({
        "which": np.repeat(np.arange(len(rows), dtype=np.int32), [len(value) for _, value, _ in rows]),
        "b": np.concatenate([b for _, _, b in rows]), "value": np.concatenate([value for _, value, _ in rows])})
    select = ", ".join(f"v.{c}" if c in ("b", "value") else f"n.{c}" for c in columns)
    con.register("bootstrap_replicate_names", names)
    con.register("bootstrap_replicate_values", values)
    try:
        con.execute(f"insert into {table} select {select} "
                    "from bootstrap_replicate_values as v inner join bootstrap_replicate_names as n using (which)")
    finally:
        con.unregister("bootstrap_replicate_names")
        con.unregister("bootstrap_replicate_values")
