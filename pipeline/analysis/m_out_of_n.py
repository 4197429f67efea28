"""norm_vs_property's statistics on m items drawn with replacement: the replicates of the m-out-of-n bootstrap.

:mod:`pipeline.analysis.bootstrap`'s docstring defines the method and its draws;
:func:`pipeline.analysis.replicates.stage_replicates` sends a sample of more than ``bootstrap_switch_n`` items
to this route: each replicate draws m of its n items with replacement, computes every statistic on them exactly
as on the full sample (average ranks over the m draws, an item drawn k times forming one tie group with itself:
``numpy.take`` then ``scipy.stats.spearmanr``), and the replicate value stored is the full-sample value plus
sqrt(m/n) times the replicate's deviation from it, so that the percentiles of the stored values are the
rescaled m-out-of-n interval.

Memory: the sample's items are never loaded whole. :func:`stage_large_sample` stages what a draw needs of each
item as a DuckDB table (spilled beyond DuckDB's memory limit), and :func:`gather` looks the draws of up to
``LOOKUP_DRAWS`` replicate draws up in one pass over it, block by block; the values the replicates are rescaled
around are ``norm_vs_property.sql``'s on the same staged rows. What a replicate holds is O(m), whatever n.

Cost: a replicate costs O(m log m) whatever n (one sort of the draws, which puts them in norm order since the
item set is kept in that order; one more sort per many-valued property; counting per value for the few-valued
ones), against O(n) for a Poisson replicate. Every variable arrives as dense integer codes of its full-sample
order (``Order.codes``): ranks among the draws are ranks among their codes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import numpy as np

from pipeline.analysis.bootstrap import (
    ItemSet,
    Order,
    Sample,
    SampleSpec,
    partial_correlation,
    rowdot,
)
from pipeline.analysis.sql_files import bind_params, load_sql

# Draws looked up in one pass over a large sample's staged items: their codes and values (6 columns) are
# ~100 MiB, whatever n. Each pass reads the staged items once, in blocks of LOOKUP_BLOCK: a block's rows come
# out of DuckDB as numpy arrays, so the block sets what a lookup holds above that (measured on the analyses of 10 M
# items, benchmarks/pipeline_ceiling.py's set: the bootstrap peaked 0.69 GiB at 262,144 rows, 0.77 at 1,048,576)
LOOKUP_DRAWS = 1 << 21
LOOKUP_BLOCK = 1 << 18
# What a draw needs of its item (the table staged by stage_large_sample): dense integer codes of the sample's
# order of norm, n_tokens, zipf and the value (equal values share one), and ln(norm) and the value less their
# least (an exact shift, for the conditioning of the sums: each replicate centres them on its own mean)
_CODES = ("c_norm", "c_tokens", "c_zipf", "c_value")
_SHIFTED = ("x_log_norm", "x_value")


def centred_ranks(codes: np.ndarray, n_codes: int, presorted: bool = False) -> np.ndarray:
    """Each row's average ranks (1..m; equal codes share their mean rank, as ``scipy.stats.rankdata``) less
    the mean rank (m + 1) / 2, of integer ``codes`` in 0 .. ``n_codes`` - 1 (r x m; ``presorted``: each row
    ascending). Half-whole numbers, exact in float64."""
    rows, m = codes.shape
    offsets = np.arange(rows, dtype=np.int64)[:, None]
    if presorted:  # tie groups are runs; codes shifted per row so that no run crosses rows
        flat = (codes + offsets * n_codes).ravel()
        starts = np.flatnonzero(np.diff(flat, prepend=-1))
        ends = np.append(starts[1:], len(flat))
        # mean 0-based index of a run over the flat array, less its row's start and the mean index (m - 1) / 2
        mean_index = np.repeat((starts + ends - 1) / 2.0, ends - starts).reshape(rows, m)
        return mean_index - (offsets * m + (m - 1) / 2.0)
    if n_codes <= m:  # few values: running counts per value, no sort
        flat = (codes + offsets * n_codes).ravel()
        counts = np.bincount(flat, minlength=rows * n_codes).reshape(rows, n_codes)
        # rank = items through the value less (its count - 1) / 2
        table = np.cumsum(counts, axis=1) - (counts - 1) / 2.0 - (m + 1) / 2.0
        return table.ravel()[flat].reshape(rows, m)
    # many values: sort each row's (code, column) pairs packed in one integer (a plain sort is cheaper than an
    # argsort and a gather), rank the sorted codes, put each rank back in its column
    shift = np.int64(max(1, (m - 1).bit_length()))
    packed = np.sort((codes.astype(np.int64) << shift) | np.arange(m, dtype=np.int64), axis=1)
    ranked = centred_ranks(packed >> shift, n_codes, presorted=True)
    out = np.empty_like(ranked)
    np.put_along_axis(out, packed & ((np.int64(1) << shift) - 1), ranked, axis=1)
    return out


def resample_statistics(item_set: ItemSet, draws: np.ndarray) -> Iterator[tuple[Sample, str, np.ndarray]]:
    """(sample, statistic, its value on each row of ``draws``) for the item set's samples: ``draws`` (r x m)
    holds indices into the item set (kept in norm order), each row ascending, so norm's codes are sorted."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r_norm = centred_ranks(item_set.norm.codes[draws], item_set.norm.n_codes, presorted=True)
        snn = rowdot(r_norm, r_norm)
        controls = {}
        for name, order in (("n_tokens", item_set.tokens), ("zipf", item_set.zipf_order)):
            if order is not None:
                r = centred_ranks(order.codes[draws], order.n_codes)
                scc = rowdot(r, r)
                controls[name] = (r, scc, rowdot(r_norm, r) / np.sqrt(snn * scc))
        x_log_norm = None
        for sample in item_set.samples:
            r_value = centred_ranks(sample.value.codes[draws], sample.value.n_codes)
            svv = rowdot(r_value, r_value)
            r_nv = rowdot(r_norm, r_value) / np.sqrt(snn * svv)
            for statistic in sample.statistics:
                if statistic == "spearman":
                    yield sample, statistic, r_nv
                elif statistic == "pearson_log_norm":
                    if x_log_norm is None:
                        x_log_norm = item_set.x_log_norm[draws]
                        x_log_norm -= x_log_norm.mean(axis=1, keepdims=True)
                        sll = rowdot(x_log_norm, x_log_norm)
                    x = sample.x_value[draws]
                    x -= x.mean(axis=1, keepdims=True)
                    yield sample, statistic, rowdot(x_log_norm, x) / np.sqrt(sll * rowdot(x, x))
                else:
                    r_control, scc, r_nc = controls[statistic.removeprefix("partial_spearman_")]
                    r_vc = rowdot(r_value, r_control) / np.sqrt(svv * scc)
                    yield sample, statistic, partial_correlation(r_nv, r_nc, r_vc)


@dataclass
class LargeSample:
    """A sample on the m-out-of-n route, staged in DuckDB as ``table`` (its ``n`` items in position order)."""

    spec: SampleSpec
    table: str
    n: int
    m: int  # draws a replicate: at most n
    n_codes: dict[str, int]  # per code column: one more than its largest code
    full: dict[str, float]  # each statistic's value on all n items (NaN where undefined)
    kept: dict[str, np.ndarray] | None = None  # the staged rows, where one block holds them: read once, not per pass

    @property
    def scale(self) -> float:
        return float(np.sqrt(self.m / self.n))


def full_sample_values(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str, str], float]:
    """``norm_vs_property.sql`` on the staged rows: each (probe set, property, statistic)'s value on all its
    items, around which the m-out-of-n replicates are rescaled (the values an audit reports)."""
    sql = load_sql("norm_vs_property")
    # on one thread: its sums then run in one order, so the same staged rows give the same values to the last bit
    # (on several, a sum's order, and its last bits, vary from run to run)
    threads = con.execute("select current_setting('threads')").fetchall()[0][0]
    con.execute("set threads = 1").fetchall()
    try:
        rows = con.execute(sql, bind_params(sql, {"model": "", "release": ""})).fetchall()
    finally:
        con.execute(f"set threads = {int(threads)}").fetchall()
    return {(r[2], r[3], r[4]): float(r[5]) for r in rows}


def stage_large_sample(con: duckdb.DuckDBPyConnection, spec: SampleSpec, m: int, table: str,
                       full: dict[tuple[str, str, str], float]) -> LargeSample:
    """Stage what a draw needs of each item of sample ``spec`` as temporary table ``table``: row ``idx`` (0-based,
    in position order: the draws' index) holds the item's codes and shifted values (:data:`_CODES`,
    :data:`_SHIFTED`). Codes keep the sample's order, ties included: the staged dense ranks of norm and of the
    value over the group (``d_norm``, ``d_value``), n_tokens less its least value, zipf ranked here."""
    zipf = "dense_rank() over (order by zipf) - 1" if "partial_spearman_zipf" in spec.statistics else "0"
    con.execute(f"""
        create or replace temp table {table} as
        select
            (row_number() over (order by pos) - 1)::integer as idx,
            d_norm::integer as c_norm,
            (n_tokens - min(n_tokens) over ())::integer as c_tokens,
            ({zipf})::integer as c_zipf,
            d_value::integer as c_value,
            ln(norm) - min(ln(norm)) over () as x_log_norm,
            value - min(value) over () as x_value
        from stg_analysis_values
        where group_key = $key {'and zipf is not null' if spec.zipf_only else ''}
        order by idx""", {"key": spec.group_key}).fetchall()
    top = con.execute(f"select {', '.join(f'max({c})' for c in _CODES)} from {table}").fetchall()[0]
    return LargeSample(spec=spec, table=table, n=spec.n, m=min(m, spec.n),
                       n_codes={c: int(t) + 1 for c, t in zip(_CODES, top, strict=True)},
                       full={s: full.get((spec.probe_set, spec.property, s), np.nan) for s in spec.statistics})


def gather(con: duckdb.DuckDBPyConnection, large: LargeSample, draws: np.ndarray,
           block: int = LOOKUP_BLOCK) -> dict[str, np.ndarray]:
    """Each column of :data:`_CODES` and :data:`_SHIFTED` at the items ``draws`` (indices into the staged table,
    any shape): one pass over the table, ``block`` rows per query."""
    flat = draws.ravel().astype(np.int64)
    out = {c: np.empty(len(flat), dtype=np.int32 if c in _CODES else np.float64) for c in (*_CODES, *_SHIFTED)}
    blocks = -(-large.n // block)
    if blocks == 1:
        order, bounds = None, np.array([0, len(flat)])
    else:  # the draws grouped by block: a stable sort of 16-bit block numbers is a radix sort, O(draws)
        which = (flat // block).astype(np.uint16 if blocks <= 1 << 16 else np.int64)
        order = np.argsort(which, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(which, minlength=blocks))])
    for index in range(blocks):
        lo, hi = bounds[index], bounds[index + 1]
        if lo == hi:
            continue
        first = index * block
        rows = large.kept or con.execute(f"select * from {large.table} where idx >= $first and idx < $last",
                                         {"first": first, "last": first + block}).fetchnumpy()
        if blocks == 1:
            large.kept = rows
        at = (flat if order is None else flat[order[lo:hi]]) - first
        idx = np.asarray(rows["idx"])
        if not np.array_equal(idx, np.arange(first, first + len(idx))):  # a scan's rows need not come in order
            where = np.empty(len(idx), dtype=np.int64)
            where[idx - first] = np.arange(len(idx))
            at = where[at]
        for column, values in out.items():
            if order is None:
                values[:] = np.asarray(rows[column])[at]
            else:
                values[order[lo:hi]] = np.asarray(rows[column])[at]
    return {c: v.reshape(draws.shape) for c, v in out.items()}


def large_statistics(large: LargeSample, drawn: dict[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray]]:
    """(statistic, its rescaled value in each replicate) from the items of ``drawn`` (:func:`gather`'s columns,
    a row per replicate): each statistic's full-sample value plus sqrt(m/n) times the replicate's deviation."""
    rows, m = drawn["c_norm"].shape
    by_norm = np.argsort(drawn["c_norm"], axis=1, kind="stable")  # ranks of norm then need no sort

    def column(name: str) -> np.ndarray:
        return np.take_along_axis(drawn[name], by_norm, axis=1).ravel()

    def order(name: str) -> Order:
        return Order(codes=column(name), n_codes=large.n_codes[name], counted=False)

    statistics = large.spec.statistics
    empty = np.empty(0)
    item_set = ItemSet(
        positions=empty.astype(np.uint32), in_norm_order=empty.astype(np.int64), norm=order("c_norm"),
        x_log_norm=column("x_log_norm"), n_tokens=empty, zipf=empty,
        tokens=order("c_tokens") if "partial_spearman_n_tokens" in statistics else None,
        zipf_order=order("c_zipf") if "partial_spearman_zipf" in statistics else None,
        samples=[Sample(large.spec.probe_set, large.spec.property, statistics, order("c_value"),
                        column("x_value") if "pearson_log_norm" in statistics else None)])
    every_draw = np.arange(rows * m).reshape(rows, m)
    for _, statistic, value in resample_statistics(item_set, every_draw):
        full = large.full[statistic]
        yield statistic, full + large.scale * (value - full)
