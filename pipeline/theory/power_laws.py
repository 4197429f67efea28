"""Power laws of the norm balance: the scaling exponent across settings, and a balance whose heat grows with
the norm (issue 35, parts 1 and 3).

**Scaling.** Without drift the equilibrium of docs/theory.md section 4 is r⁴ = ηh/(2λ), so across settings
log r = ¼ log(ηh/λ) + const: :func:`fit_exponent` fits the slope by least squares with a Student t interval.

**Heat that scales with the norm.** The balance assumes the heat h does not depend on the norm. In a real
encoder it can: if every weight shrinks, the item's whole move shrinks with it. :func:`fit_heat_power` fits
h = c r^k per item (least squares of log h on log r over the steps of a window). With that heat the balance is

    E[Δr²] / η = g(s) = −2λ s + 2d + η c s^((k−2)/2),      s = r²

With d = 0 its positive root is s* = (ηc / 2λ)^(2/(4−k)), stable (g > 0 below it, < 0 above) only for k < 4;
for k > 4 the root repels (the norm runs off to 0 or ∞) and for k = 4 there is none unless ηc = 2λ: decay
and heat then scale alike, and the norm only shrinks or grows geometrically. A positive drift adds a stable
root at small s for any k. :func:`corrected_equilibrium` returns the largest stable root (where g crosses
from + to −), NaN where there is none; k = 0 gives back section 4's closed form.
"""

from __future__ import annotations

import numpy as np

__all__ = ["corrected_equilibrium", "fit_exponent", "fit_heat_power", "integrate_corrected"]


def fit_exponent(x: np.ndarray, y: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Least-squares slope of ``y`` on ``x`` with its Student t interval (n − 2 degrees of freedom).

    For the scaling law: ``x`` = log(ηh/λ), ``y`` = log r, one point per run; the formula says slope ¼.
    Returns ``slope``, ``lo``, ``hi``, ``intercept``, ``se`` and ``n``.
    """
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    n = x.size
    xc = x - x.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean())) / sxx
    intercept = float(y.mean() - slope * x.mean())
    resid = y - intercept - slope * x
    se = float(np.sqrt((resid @ resid) / (n - 2) / sxx)) if n > 2 else float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, n - 2)) * se if n > 2 else float("nan")
    return {"slope": slope, "lo": slope - half, "hi": slope + half, "intercept": intercept, "se": se, "n": n}


def fit_heat_power(norms: np.ndarray, heat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per item (column), least squares of log h on log r over the rows (steps): exponent k and log c.

    Steps with zero heat have no log and are left out of that item's fit; an item with fewer than three usable
    steps, or whose norm does not vary, gets NaN.
    """
    log_r, heat = np.log(np.asarray(norms, float)), np.asarray(heat, float)
    ok = heat > 0
    log_h = np.where(ok, np.log(np.where(ok, heat, 1.0)), 0.0)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = np.where(ok, log_r, 0.0).sum(0) / n
        my = log_h.sum(0) / n
        dx = np.where(ok, log_r - mx, 0.0)
        sxx = (dx * dx).sum(0)
        k = (dx * np.where(ok, log_h - my, 0.0)).sum(0) / sxx
        k = np.where((n >= 3) & (sxx > 0), k, np.nan)
    return k, my - k * mx


def _balance(s: np.ndarray, d, c, k, eta: float, weight_decay: float) -> np.ndarray:
    """g(s) = −2λs + 2d + ηc s^((k−2)/2), the balance divided by η (module docstring)."""
    with np.errstate(over="ignore"):  # far ends of the search grid with a large k: inf has the right sign
        return -2.0 * weight_decay * s + 2.0 * d + eta * c * s ** ((k - 2.0) / 2.0)


def corrected_equilibrium(d: np.ndarray, c: np.ndarray, k: np.ndarray, eta: float, weight_decay: float,
                          scale: np.ndarray, decades: float = 8.0, grid: int = 1601) -> np.ndarray:
    """Per item, the norm at the largest stable root of the balance with heat h = c r^k (module docstring).

    The root is searched for on a log grid of r² from ``scale`` × 10^−decades to ``scale`` × 10^decades
    (``scale``: a typical r² of the item, e.g. its measured mean) and refined by bisection to machine
    precision. NaN where g never crosses from + to − on the grid (no stable fixed point there).
    """
    shape = np.shape(scale)
    d, c, k, scale = (np.broadcast_to(np.asarray(a, float), shape).ravel() for a in (d, c, k, scale))
    s = scale[:, None] * np.logspace(-decades, decades, grid)[None, :]
    g = _balance(s, d[:, None], c[:, None], k[:, None], eta, weight_decay)
    down = (g[:, :-1] > 0) & (g[:, 1:] <= 0)
    has = down.any(1)
    j = np.where(has, down.shape[1] - 1 - np.argmax(down[:, ::-1], axis=1), 0)  # the largest crossing
    rows = np.arange(s.shape[0])
    lo, hi = s[rows, j], s[rows, j + 1]
    for _ in range(200):  # bisection: halves the bracket; stops changing once it reaches float precision
        mid = 0.5 * (lo + hi)
        pos = _balance(mid, d, c, k, eta, weight_decay) > 0
        lo, hi = np.where(pos, mid, lo), np.where(pos, hi, mid)
    root = np.where(has, 0.5 * (lo + hi), np.nan)
    return np.sqrt(root).reshape(shape)


def integrate_corrected(r2: np.ndarray, d: np.ndarray, c: np.ndarray, k: np.ndarray, eta: float,
                        weight_decay: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The balance with h = c r^k stepped forward ``steps`` times from ``r2`` (fixed d, c, k); returns the mean
    norm over those steps and the norm after the last, as
    :func:`pipeline.theory.trace_formula.integrate_balance` does for constant heat."""
    r2 = np.asarray(r2, float).copy()
    total = np.zeros_like(r2)
    for _ in range(steps):
        with np.errstate(over="ignore", invalid="ignore"):  # a runaway (k > 4) becomes inf: it scores NaN
            heat = c * r2 ** (k / 2.0)
            r2 = np.maximum(r2 + 2 * eta * (d - weight_decay * r2) + eta**2 * heat / r2, 1e-12)
        total += np.sqrt(r2)
    return total / max(steps, 1), np.sqrt(r2)
