"""The norm-dynamics formula on a transformer: scored out of sample from a fine-tune's ``training_trace``.

Per item and traced step ``t`` (one optimizer step apart, learning rate ``eta_t``), with ``r`` the norm
before the step, the trace gives the radial displacement ``rho`` and the tangential length ``tau``:

- heat ``h = r^2 tau^2 / eta^2`` (docs/theory.md section 6, the tangential part of the actual displacement);
- drift ``d = r rho / eta + lambda r^2``. Section 6 asks for a forward-mode JVP along the update; the trace
  has the actual displacement only, so ``r rho`` stands for ``<z, JVP>`` and the second-order radial part
  (``rho^2``: 1.5e-3 of ``|2 r rho|`` in the default adamw run) is folded into ``d``. This is a shortcut: it
  makes ``d`` exact bookkeeping of the first half, which is why only the *second* half is scored.

The first half of the window gives per-item means of ``d`` and ``h``; the equilibrium of section 4
(:func:`pipeline.theory.estimators.equilibrium_norm`) predicts the second half's mean norm and the
norm at the last step. Beside it, the baselines that need no theory (:mod:`pipeline.theory.baselines`:
persistence, the first half's mean norm; ``last``, its last norm; ``decay``, that times pure decay
(1 - eta lambda)^dt; ``trend``, a per-item line through the first half) and heat only (``d = 0``); the same
terms as a forecast instead of an equilibrium (``integrated``: the balance stepped forward from the first
half's last norm), since with AdamW's small ``eta lambda`` the equilibrium lies ~1 / (eta lambda) steps away,
far beyond a short fine-tune; and the balance corrected for a heat that scales with the norm, h = c r^k fitted
per item on the first half (:mod:`pipeline.theory.power_laws`): its equilibrium (``corrected``, NaN for an
item without a stable fixed point) and its forecast (``corrected_integrated``).
``lambda`` is the optimizer's weight decay: for SGD the
coupled decay the formula assumes; for AdamW the decoupled decay ``theta <- (1 - eta lambda) theta``
gives the same ``-2 eta lambda r^2`` term for parameters that scale the output, so the same
balance is tested (the rotational equilibrium of decoupled decay), with Adam's normalised step
inside the measured ``h``. The effective decay ``lambda_eff = lambda - d / r^2`` is reported as
section 6 asks.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from pipeline.theory.baselines import baseline_predictions
from pipeline.theory.estimators import equilibrium_norm, score
from pipeline.theory.power_laws import corrected_equilibrium, fit_heat_power, integrate_corrected


def read_trace(store: Store, run: str) -> pl.DataFrame:
    """A run's rows of the ``training_trace`` view (gated parts only), by step and item."""
    con = open_catalog(store, verify=None)
    try:
        frame = con.sql("select * from training_trace where run = $run order by step, item_id",
                        params={"run": run}).pl()
    finally:
        con.close()
    if frame.height == 0:
        raise LookupError(f"run {run!r} has no training_trace rows under {store.url()}")
    return frame


def per_step_terms(trace: pl.DataFrame, weight_decay: float) -> pl.DataFrame:
    """Per (item, step) of one-step displacements: ``r2`` before the step, ``d``, ``h`` and the norm after."""
    one = trace.filter((pl.col("steps_since") == 1) & (pl.col("lr") > 0))
    if one.height == 0:
        raise ValueError("the trace has no one-step displacements: the formula needs a trace of every step "
                         "(--trace-every 1; docs/theory.md section 6: subsampled heat collapses for a shared encoder)")
    r2 = pl.col("norm") ** 2 - pl.col("r2_change")
    return one.select(
        "item_id", "kind", "step", "norm", "lr", r2.alias("r2"),
        (r2.sqrt() * pl.col("radial") / pl.col("lr") + weight_decay * r2).alias("d"),
        (r2 * pl.col("tangential") ** 2 / pl.col("lr") ** 2).alias("h"),
    )


def integrate_balance(r2: np.ndarray, d: np.ndarray, h: np.ndarray, eta: float, weight_decay: float,
                      steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Step the balance ``r^2 += 2 eta (d - lambda r^2) + eta^2 h / r^2`` forward ``steps`` times from ``r2``
    with fixed ``d`` and ``h``; returns the mean norm over those steps and the norm after the last.

    Not the equilibrium: the same terms used as a forecast of the next steps, which is what they can say
    when ``eta lambda`` is so small that the equilibrium lies thousands of steps away.
    """
    r2 = np.asarray(r2, float).copy()
    total = np.zeros_like(r2)
    for _ in range(steps):
        r2 = np.maximum(r2 + 2 * eta * (d - weight_decay * r2) + eta**2 * h / r2, 1e-12)
        total += np.sqrt(r2)
    return total / max(steps, 1), np.sqrt(r2)


def formula_predictions(trace: pl.DataFrame, weight_decay: float, window_start: int = 0) -> tuple[pl.DataFrame, dict]:
    """Per item: the three predictions from the first half of ``[window_start, last step]`` and the observed
    norms (second-half mean, last step); and the window's facts (steps, eta, lambda_eff median)."""
    terms = per_step_terms(trace.filter(pl.col("step") >= window_start), weight_decay)
    steps = terms["step"].unique().sort()
    if steps.len() < 4:
        raise ValueError(f"{steps.len()} one-step traces in the window: the formula needs at least 4 "
                         "(lengthen --steps or lower the window start)")
    mid = steps[steps.len() // 2]
    half = terms.with_columns((pl.col("step") >= mid).alias("second"))
    first = half.filter(~pl.col("second")).group_by("item_id", "kind").agg(
        pl.col("d").mean(), pl.col("h").mean(), pl.col("r2").mean(), pl.col("norm").mean().alias("persistence"),
        pl.col("lr").mean().alias("eta"))
    second = half.filter(pl.col("second")).group_by("item_id").agg(pl.col("norm").mean().alias("second_half"))
    last = trace.filter(pl.col("step") == steps[-1]).select("item_id", pl.col("norm").alias("final"))
    start = terms.filter(pl.col("step") == steps.filter(steps < mid).max()).select(
        "item_id", pl.col("norm").alias("start"))
    items = first.join(second, on="item_id").join(last, on="item_id").join(start, on="item_id").sort("item_id")
    eta = float(items["eta"].mean())
    d, h, r2 = (items[c].to_numpy() for c in ("d", "h", "r2"))
    n_second = int((steps >= mid).sum())
    mean2, final2 = integrate_balance(items["start"].to_numpy() ** 2, d, h, eta, weight_decay, n_second)
    # the first half as [steps, items] matrices, items in the same order as ``items``
    wide = half.filter(~pl.col("second")).sort("step")
    ids = items["item_id"].to_list()
    norm_m = wide.pivot(on="item_id", index="step", values="norm").select(ids).to_numpy()
    heat_m = wide.pivot(on="item_id", index="step", values="h").select(ids).to_numpy()
    r_m = wide.pivot(on="item_id", index="step", values="r2").select(ids).to_numpy() ** 0.5
    fit_steps = steps.filter(steps < mid).to_numpy()
    target = steps.filter(steps >= mid).to_numpy()
    base = baseline_predictions(norm_m, fit_steps, target, eta, weight_decay)
    base_final = baseline_predictions(norm_m, fit_steps, target[-1:], eta, weight_decay)
    k, log_c = fit_heat_power(r_m, heat_m)
    c = np.exp(log_c)
    corr_mean, corr_final = integrate_corrected(items["start"].to_numpy() ** 2, d, c, k, eta, weight_decay,
                                                n_second)
    items = items.with_columns(
        pl.Series("formula", equilibrium_norm(d, h, eta, weight_decay)),
        pl.Series("heat_only", equilibrium_norm(np.zeros_like(h), h, eta, weight_decay)),
        pl.Series("integrated", mean2), pl.Series("integrated_final", final2),
        *(pl.Series(name, base[name]) for name in ("last", "decay", "trend")),
        *(pl.Series(f"{name}_final", base_final[name]) for name in ("last", "decay", "trend")),
        pl.Series("heat_power_k", k),
        pl.Series("corrected", corrected_equilibrium(d, c, k, eta, weight_decay, r2)),
        pl.Series("corrected_integrated", corr_mean), pl.Series("corrected_integrated_final", corr_final),
    )
    facts = {"window": [int(steps[0]), int(mid), int(steps[-1])], "items": items.height, "lambda": weight_decay,
             "eta": eta, "lambda_eff_median": float(np.median(weight_decay - d / r2)),
             # k is NaN for an item with fewer than 3 usable steps: the median of the rest, NaN if none (no warning)
             "heat_power_k_median": float(np.median(k[np.isfinite(k)])) if np.isfinite(k).any() else float("nan"),
             "fixed_point_share": float(np.isfinite(items["corrected"].to_numpy()).mean())}
    return items, facts


PREDICTIONS = ("formula", "persistence", "last", "decay", "trend", "heat_only", "integrated", "corrected",
               "corrected_integrated")
FINAL_COLUMNS = {"integrated", "last", "decay", "trend", "corrected_integrated"}  # have a ``_final`` column


def score_formula(trace: pl.DataFrame, weight_decay: float, window_start: int = 0) -> dict:
    """Out-of-sample scores of the equilibrium norm from the first half of ``[window_start, last step]``.

    Returns ``{"window", "items", "lambda", "eta", "lambda_eff_median", "heat_power_k_median",
    "fixed_point_share", "second_half": {...}, "final": {...}}``; each target holds, for every name in
    :data:`PREDICTIONS` (module docstring), the scores (R^2, R^2 of log, Spearman) and ``ratio_median``
    (predicted / observed norm).
    """
    items, out = formula_predictions(trace, weight_decay, window_start)
    for target in ("second_half", "final"):
        observed = items[target].to_numpy()
        out[target] = {}
        for name in PREDICTIONS:
            column = f"{name}_final" if target == "final" and name in FINAL_COLUMNS else name
            predicted = items[column].to_numpy()
            out[target][name] = {**score(predicted, observed), "ratio_median": float(np.median(predicted / observed))}
    return out
