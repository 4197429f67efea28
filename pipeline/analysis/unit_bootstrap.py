"""Poisson bootstrap of unit-level statistics: AUROC, selective accuracy, means, rank correlations.

The units are a statistic's sampling units (a retrieval set's queries, the matched tokens of a vocabulary,
the items of a probe set). Replicate b gives unit number ``pos`` (its 0-based position among its set's units
ordered by key) the Poisson(1) weight of :mod:`pipeline.analysis.bootstrap` (same hash, same seed: the same
units are resampled wherever the same positions are), and every statistic is computed on the resample as on
the full sample, a unit of weight w standing for w copies (the same as ``numpy.repeat`` of the rows):

- **AUROC** (Mann-Whitney, ties count 1/2, as ``sklearn.metrics.roc_auc_score`` on the repeated rows):
  sum over positive units of w * (negative weight below + half the negative weight tied) / (W+ * W-),
  one sort of the scores for all replicates. Undefined (NaN) in a replicate without both outcomes.
- **Selective accuracy at coverage c** (tenths): the success rate of the first ceil(c * W / 10) copies in
  the order score descending, key ascending (``sql/retrieval_calibration.sql``'s order); a unit straddling
  the cut counts with the copies inside it.
- **Spearman / partial Spearman** with any number of controls: weighted average ranks of each variable
  (:class:`pipeline.analysis.bootstrap.Order`), then the correlation of the first two given the rest from
  the inverse of their weighted covariance matrix (the correlation of rank residuals, as regressing ranks on
  the controls' ranks).

Intervals are the 2.5% and 97.5% percentiles (linear interpolation, as ``numpy.quantile``) of the replicates
where a statistic is defined; ``n_resamples`` counts those. A two-sided bootstrap p-value of a null value
theta0 is min(1, 2 * min(share of replicates <= theta0, share >= theta0)).
"""

from __future__ import annotations

import numpy as np

from pipeline.analysis.bootstrap import Buffers, Order, poisson_weights, replicate_keys
from pipeline.analysis.replicates import POISSON  # noqa: F401 - re-exported: the method label the audit uses

# replicate x unit cells computed at once (a float64 array of a chunk: 4 MiB)
CHUNK_CELLS = 1 << 19
COVERAGE_TENTHS = tuple(range(1, 11))


def replicate_chunks(seed: int, resamples: int, n_units: int):
    """Yield ``(first replicate, weights)`` chunks covering replicates 0 .. resamples - 1 of ``n_units`` units
    at positions 0 .. n_units - 1: each a (replicates x units) float64 array, at most :data:`CHUNK_CELLS`
    cells (one replicate at least)."""
    step = max(1, CHUNK_CELLS // max(1, n_units))
    positions = np.arange(n_units, dtype=np.uint32)
    for first in range(0, resamples, step):
        count = min(step, resamples - first)
        yield first, poisson_weights(replicate_keys(seed, first, count), positions, Buffers()).copy()


def interval(replicates: np.ndarray) -> tuple[float | None, float | None, int]:
    """(ci_low, ci_high, n_resamples): the 95% percentile interval over the finite replicates."""
    finite = replicates[np.isfinite(replicates)]
    if not len(finite):
        return None, None, 0
    low, high = np.quantile(finite, [0.025, 0.975])
    return float(low), float(high), len(finite)


def bootstrap_p(replicates: np.ndarray, null: float) -> float:
    """Two-sided bootstrap p-value of ``null``: twice the smaller share of finite replicates on either side."""
    finite = replicates[np.isfinite(replicates)]
    if not len(finite):
        return float("nan")
    return float(min(1.0, 2 * min(np.mean(finite <= null), np.mean(finite >= null))))


class AurocOrder:
    """One signal's fixed order over the units with a score, for weighted AUROCs of any outcome."""

    def __init__(self, score: np.ndarray) -> None:
        self.keep = np.flatnonzero(np.isfinite(score))
        kept = score[self.keep]
        self.perm = self.keep[np.argsort(kept, kind="stable")]
        ranked = score[self.perm]
        # tie groups of equal scores in ascending order: their starts, for per-group sums (None: no ties)
        starts = np.flatnonzero(np.concatenate([[True], ranked[1:] != ranked[:-1]])) if len(ranked) else None
        self.starts = None if starts is None or len(starts) == len(ranked) else starts

    def auroc(self, success: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each replicate's AUROC of this signal for ``success`` (0/1 per unit); NaN without both outcomes."""
        return self.aurocs([success], w)[0]

    def aurocs(self, successes: list[np.ndarray], w: np.ndarray) -> list[np.ndarray]:
        """:meth:`auroc` for several outcomes, the weights put in this signal's order once."""
        if not len(self.perm):
            return [np.full(len(w), np.nan) for _ in successes]
        ws = w[:, self.perm]
        group = ws if self.starts is None else np.add.reduceat(ws, self.starts, axis=1)
        out = []
        for success in successes:
            s = success[self.perm].astype(np.float64)
            pos = ws * s if self.starts is None else np.add.reduceat(ws * s, self.starts, axis=1)
            neg = group - pos
            # negative weight below each group plus half the group's own: cumsum - neg / 2
            below = np.cumsum(neg, axis=1)
            below -= 0.5 * neg
            n_pos, n_neg = pos.sum(axis=1), below[:, -1] + 0.5 * neg[:, -1]
            with np.errstate(divide="ignore", invalid="ignore"):
                value = np.einsum("ij,ij->i", pos, below) / (n_pos * n_neg)
            value[(n_pos == 0) | (n_neg == 0)] = np.nan
            out.append(value)
        return out


class SelectiveOrder:
    """One signal's order for selective accuracy: score descending, then key ascending (units are already
    in key order, so ties keep their position)."""

    def __init__(self, score: np.ndarray) -> None:
        keep = np.flatnonzero(np.isfinite(score))
        self.perm = keep[np.lexsort((keep, -score[keep]))]

    def curve(self, success: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(replicates x 10): success rate of the top tenths 1..10 of each replicate's copies.

        The first k copies are the units before the first whose running weight reaches k, and k less that
        running weight's value before it, of that unit: two running sums, one search per replicate."""
        out = np.full((len(w), len(COVERAGE_TENTHS)), np.nan)
        if not len(self.perm):
            return out
        ws = w[:, self.perm]
        s = success[self.perm].astype(np.float64)
        through = np.cumsum(ws, axis=1)
        hits = np.cumsum(ws * s, axis=1)
        tenths = np.asarray(COVERAGE_TENTHS, dtype=np.float64)
        for b in range(len(w)):
            total = through[b, -1]
            if total == 0:
                continue
            kept = (tenths * total + 9) // 10  # ceil(tenths * W / 10) in whole copies
            last = np.searchsorted(through[b], kept, side="left")  # the unit holding copy number kept
            before = np.where(last > 0, through[b, last - 1], 0.0)
            hits_before = np.where(last > 0, hits[b, last - 1], 0.0)
            out[b] = (hits_before + (kept - before) * s[last]) / kept
        return out


def weighted_mean(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each replicate's weighted mean of ``values``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (w @ values) / w.sum(axis=1)


def partial_rank_correlation(columns: list[np.ndarray], w: np.ndarray) -> np.ndarray:
    """Each replicate's Spearman correlation of ``columns[0]`` and ``columns[1]`` given ``columns[2:]``
    (average ranks over the resample; with no controls, plain Spearman)."""
    size = w.sum(axis=1, keepdims=True)
    buffers = Buffers()
    ranks = [Order.of(np.asarray(c, dtype=np.float64)).centred_ranks(w, size, np.empty_like(w), buffers)
             for c in columns]
    k = len(ranks)
    cov = np.empty((len(w), k, k))
    for i in range(k):
        wr = w * ranks[i]
        for j in range(i, k):
            cov[:, i, j] = cov[:, j, i] = np.einsum("ij,ij->i", wr, ranks[j])
    with np.errstate(divide="ignore", invalid="ignore"):
        if k == 2:
            return cov[:, 0, 1] / np.sqrt(cov[:, 0, 0] * cov[:, 1, 1])
        out = np.full(len(w), np.nan)
        ok = np.isfinite(cov).all(axis=(1, 2)) & (np.linalg.matrix_rank(cov) == k)
        if ok.any():
            prec = np.linalg.inv(cov[ok])
            out[ok] = -prec[:, 0, 1] / np.sqrt(prec[:, 0, 0] * prec[:, 1, 1])
        return out


def weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each replicate's Pearson correlation of ``x`` and ``y`` (centred on the full sample first: exact
    arithmetic does not depend on it, float64 loses less)."""
    x, y = x - x.mean(), y - y.mean()
    sw, sx, sy = w.sum(axis=1), w @ x, w @ y
    sxx, syy, sxy = w @ (x * x), w @ (y * y), w @ (x * y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (sw * sxy - sx * sy) / np.sqrt((sw * sxx - sx * sx) * (sw * syy - sy * sy))
