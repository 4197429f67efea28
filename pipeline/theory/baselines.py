"""Baselines every norm forecast must beat, and the intervals that say whether it does.

A prediction of later norms scores well whenever norms barely move, or whenever they only decay: a
formula is evidence only where it beats the predictions that need no theory (issue 35). From the norms of
a fit window (``[steps, items]``) and the steps of the target (the steps whose mean norm is predicted):

- ``persistence``: each item's mean norm over the fit window;
- ``last``: its last norm in the fit window;
- ``decay``: the last norm times pure weight decay, ``(1 - eta lambda)^dt``, averaged over the target steps
  (zero parameters: what the decay alone would do to a norm nothing else moves);
- ``trend``: a per-item straight line through the fit window's norms, averaged over the target steps (a line
  that extrapolates below zero is clipped at :data:`TREND_FLOOR`, so that its log is defined).

Each is scored like the formula (:func:`pipeline.theory.estimators.score`: R² on norms, R² on log-norms,
Spearman). Intervals: over seeds (:func:`seed_summary`, Student t) where a setting was run with several
seeds, over items (:func:`bootstrap_differences`) where there is one run.
"""

from __future__ import annotations

import numpy as np

from pipeline.theory.estimators import r2_score, score, spearman
from pipeline.theory.imprint import t_interval

__all__ = ["BASELINES", "METRICS", "TREND_FLOOR", "baseline_predictions", "bootstrap_differences", "holds",
           "seed_summary"]

BASELINES = ("persistence", "last", "decay", "trend")
METRICS = ("r2", "r2_log", "spearman")
TREND_FLOOR = 1e-9


def baseline_predictions(norms: np.ndarray, steps: np.ndarray, target_steps: np.ndarray, eta: float,
                         weight_decay: float) -> dict[str, np.ndarray]:
    """The four baselines' predictions of each item's mean norm over ``target_steps``.

    Args:
        norms: ``[T, N]`` norms of N items at the fit window's T steps (each after its step).
        steps: the T step numbers of ``norms``.
        target_steps: the steps whose mean norm is predicted (one step for a single-step target).
    """
    norms = np.asarray(norms, float)
    steps, target = np.asarray(steps, float), np.asarray(target_steps, float)
    last = norms[-1]
    # mean over the target of the decay factor since the fit window's last step
    factor = float(np.mean((1.0 - eta * weight_decay) ** (target - steps[-1])))
    centred = steps - steps.mean()
    denom = float(centred @ centred)
    slope = (centred @ (norms - norms.mean(0))) / denom if denom > 0 else np.zeros(norms.shape[1])
    trend = norms.mean(0) + slope * (target.mean() - steps.mean())
    return {"persistence": norms.mean(0), "last": last, "decay": last * factor,
            "trend": np.maximum(trend, TREND_FLOOR)}


def _metric(name: str, predicted: np.ndarray, observed: np.ndarray) -> float:
    if name == "r2":
        return r2_score(predicted, observed)
    if name == "r2_log":
        return r2_score(np.log(predicted), np.log(observed))
    return spearman(predicted, observed)


def bootstrap_differences(predictions: dict[str, np.ndarray], observed: np.ndarray, reference: str = "formula",
                          n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Scores of every prediction, and ``reference`` minus each other prediction with a bootstrap interval over
    items (the items resampled with replacement, the same resample for every prediction).

    Returns ``{name: {metric: value}}`` and, under ``"difference"``, ``{name: {metric: [diff, lo, hi]}}``.
    A prediction with a non-positive or non-finite value scores NaN (as :func:`score`).
    """
    observed = np.asarray(observed, float)
    out: dict = {name: score(np.asarray(p, float), observed) for name, p in predictions.items()}
    rng = np.random.default_rng(seed)
    n = observed.size
    draws = {name: {m: np.empty(n_boot) for m in METRICS} for name in predictions}
    for b in range(n_boot):
        idx = rng.integers(0, n, n)
        for name, p in predictions.items():
            p = np.asarray(p, float)[idx]
            ok = bool(np.all(np.isfinite(p)) and np.all(p > 0))
            for m in METRICS:
                draws[name][m][b] = _metric(m, p, observed[idx]) if ok else np.nan
    tail = (1 - level) / 2
    out["difference"] = {}
    for name in predictions:
        if name == reference:
            continue
        out["difference"][name] = {}
        for m in METRICS:
            diff = draws[reference][m] - draws[name][m]
            lo, hi = (np.quantile(diff, [tail, 1 - tail]) if np.isfinite(diff).all() else (np.nan, np.nan))
            out["difference"][name][m] = [out[reference][m] - out[name][m], float(lo), float(hi)]
    return out


def seed_summary(scores: list[dict[str, dict[str, float]]], reference: str = "formula",
                 level: float = 0.95) -> dict:
    """Means over seeds with Student t intervals: each prediction's metrics, and ``reference`` minus each other
    prediction, paired by seed.

    ``scores`` is one ``{name: {metric: value}}`` per seed. Returns ``{name: {metric: [mean, lo, hi]}}`` and,
    under ``"difference"``, ``{name: {metric: [mean, lo, hi]}}``.
    """
    names = list(scores[0])
    out: dict = {name: {m: list(t_interval(np.array([s[name][m] for s in scores]), level)) for m in METRICS}
                 for name in names}
    out["difference"] = {
        name: {m: list(t_interval(np.array([s[reference][m] - s[name][m] for s in scores]), level))
               for m in METRICS}
        for name in names if name != reference}
    return out


def holds(summary: dict, metric: str, baselines: tuple[str, ...] = BASELINES) -> bool:
    """The issue's bar: ``reference`` beats every baseline on ``metric`` with an interval that excludes 0."""
    return all(summary["difference"][b][metric][1] > 0 for b in baselines)
