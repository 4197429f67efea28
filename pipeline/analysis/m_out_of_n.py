"""norm_vs_property's statistics on m items drawn with replacement: the replicates of the m-out-of-n bootstrap.

:mod:`pipeline.analysis.bootstrap`'s docstring defines the method and its draws;
:func:`pipeline.analysis.replicates.stage_replicates` sends a sample of more than ``bootstrap_switch_n`` items
to this route: each replicate draws m of its n items with replacement, computes every statistic on them exactly
as on the full sample (average ranks over the m draws, an item drawn k times forming one tie group with itself:
``numpy.take`` then ``scipy.stats.spearmanr``), and the replicate value stored is the full-sample value plus
sqrt(m/n) times the replicate's deviation from it, so that the percentiles of the stored values are the
rescaled m-out-of-n interval.

Cost: a replicate costs O(m log m) whatever n (one sort of the draws, which puts them in norm order since the
item set is kept in that order; one more sort per many-valued property; counting per value for the few-valued
ones), against O(n) for a Poisson replicate. Every variable arrives as dense integer codes of its full-sample
order (``Order.codes``): ranks among the draws are ranks among their codes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.analysis.bootstrap import ItemSet, Sample, draw_positions, partial_correlation, rowdot


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


def full_sample_statistics(item_set: ItemSet) -> dict[tuple[int, str], float]:
    """Every statistic of the item set's samples on all of its items, by (index of the sample, statistic):
    the values the m-out-of-n replicates are rescaled around (norm_vs_property.sql's, computed here)."""
    every_item = np.arange(len(item_set.positions))[None, :]
    index = {id(sample): i for i, sample in enumerate(item_set.samples)}
    return {(index[id(sample)], statistic): float(value[0])
            for sample, statistic, value in resample_statistics(item_set, every_item)}


@dataclass
class Subsampled:
    """An item set on the m-out-of-n route: its draws' map to the item set and the values they rescale around."""

    m: int
    by_position: np.ndarray  # index in the item set (norm order) of the item at each position among its items
    full: dict[tuple[int, str], float]  # full_sample_statistics
    scale: float  # sqrt(m / n)


def subsampled(item_set: ItemSet, m: int) -> Subsampled:
    """The m-out-of-n route of ``item_set`` with ``m`` draws a replicate (at most its n items)."""
    n = len(item_set.positions)
    m = min(m, n)
    return Subsampled(m=m, by_position=np.argsort(item_set.positions, kind="stable"),
                       full=full_sample_statistics(item_set), scale=float(np.sqrt(m / n)))


def subsample_statistics(item_set: ItemSet, route: Subsampled,
                          keys: np.ndarray) -> Iterator[tuple[Sample, str, np.ndarray]]:
    """The m-out-of-n replicates of ``keys``: each statistic's full-sample value plus sqrt(m/n) times the
    replicate's deviation from it (the percentile interval of these values is the rescaled one)."""
    draws = route.by_position[draw_positions(keys, route.m, len(item_set.positions))]
    draws.sort(axis=1)  # the item set is in norm order: sorted draws are too
    index = {id(sample): i for i, sample in enumerate(item_set.samples)}
    for sample, statistic, value in resample_statistics(item_set, draws):
        full = route.full[(index[id(sample)], statistic)]
        yield sample, statistic, full + route.scale * (value - full)
