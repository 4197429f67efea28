"""Per-item estimates of radial drift d_i and heat h_i (docs/theory.md sections 4 and 6), and the
equilibrium norm they predict, scored against norms they were *not* estimated from.

Per step, for every item (measured at every step of the window, never subsampled):

- ``h`` = r^2 * ||tangential part of the actual displacement||^2 / eta^2. For a free table row the
  displacement is eta * (own gradient) plus decay, so this is exactly the row's squared spherical gradient
  (zero when the row was not in the batch); for a shared encoder it also carries what the other items'
  gradients did to this item through the shared weights.
- ``d`` from the forward-mode JVP dz of z along the actual parameter update (weight decay included):
  the first-order change of r^2 is 2 <z, dz> = -2 eta lambda r^2 + 2 eta d, so d = <z, dz>/eta + lambda r^2.

Section 6's warning: the window-mean of these two terms adds back up (to first order) to the measured
change of r^2 over the same steps, so a prediction scored on those same steps is bookkeeping. Every score
here is out of sample: the first half of the window predicts the second half's norms, or one seed's
estimates predict another seed's norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "BALANCE_TERMS",
    "Estimates",
    "NormTracker",
    "equilibrium_norm",
    "r2_score",
    "score",
    "spearman",
    "step_terms",
]


def step_terms(z, jz, z_after, lr: float, weight_decay: float):
    """Per-item (r^2, d, h) of one step from the embeddings before, their JVP along the update, and after.

    Args:
        z: [N, k] embeddings before the step.
        jz: [N, k] first-order change of z along the actual parameter update.
        z_after: [N, k] embeddings after the step.
    Returns:
        Three float64 arrays of length N.
    """
    r2 = (z * z).sum(1)
    u = z / r2.sqrt()[:, None]
    disp = z_after - z
    tangential = disp - (disp * u).sum(1, keepdim=True) * u
    h = r2 * (tangential * tangential).sum(1) / lr**2
    d = (z * jz).sum(1) / lr + weight_decay * r2
    return r2.double().numpy(), d.double().numpy(), h.double().numpy()


BALANCE_TERMS = ("measured", "first_order", "tangential", "radial_squared", "second_order")


def _balance_terms(z, jz, z_after) -> np.ndarray:
    """Per item: the measured change of r^2 and its exact split into :attr:`NormTracker.balance`'s terms."""
    disp = z_after - z
    u = z / (z * z).sum(1, keepdim=True).sqrt()
    radial = (disp * u).sum(1)
    disp2 = (disp * disp).sum(1)
    terms = [
        (z_after * z_after).sum(1) - (z * z).sum(1),
        2.0 * (z * jz).sum(1),
        disp2 - radial**2,
        radial**2,
        2.0 * (z * (disp - jz)).sum(1),
    ]
    return np.stack([t.double().numpy() for t in terms])


@dataclass(frozen=True)
class Estimates:
    """Window means of one half (or the whole window) of a run, per item."""

    r2: np.ndarray  # mean r^2 before each step
    norm: np.ndarray  # mean r
    d: np.ndarray  # radial drift per step
    d_decay: np.ndarray  # the part of d due to the weight-decay part of the update (0 for a free row)
    h: np.ndarray  # heat per step
    final_norm: np.ndarray  # norm after the half's last step
    lr: float
    weight_decay: float

    def predicted_norm(self, d: np.ndarray | None = None, h: np.ndarray | None = None) -> np.ndarray:
        """Equilibrium norm of section 4 from these (or substituted) d and h."""
        d, h = (self.d if d is None else d), (self.h if h is None else h)
        return equilibrium_norm(d, h, self.lr, self.weight_decay)

    @property
    def lambda_eff(self) -> np.ndarray:
        """Effective decay lambda - d / r^2: with it the equilibrium reads r^4 = eta h / (2 lambda_eff)."""
        return self.weight_decay - self.d / self.r2

    @property
    def lambda_eff_decay(self) -> np.ndarray:
        """The part of :attr:`lambda_eff` that the decay of (shared) weights alone produces."""
        return self.weight_decay - self.d_decay / self.r2


class NormTracker:
    """Accumulates :func:`step_terms` and norms over the two halves of the measuring window."""

    def __init__(self, n_items: int, lr: float, weight_decay: float, start: int, stop: int) -> None:
        self.lr, self.weight_decay = lr, weight_decay
        self.start, self.mid, self.stop = start, start + (stop - start) // 2, stop
        self._sums = np.zeros((2, 5, n_items))  # half x (r2, r, d, h, d_decay) x item
        self._steps = np.zeros(2)
        self._final = np.zeros((2, n_items))
        self._balance = np.zeros((len(BALANCE_TERMS), n_items))

    def update(self, step: int, z, jz, z_after, jz_decay) -> None:
        """Add one measured step (tensors as in :func:`step_terms`; ``jz_decay`` is the JVP along the
        weight-decay part of the update alone)."""
        half = int(step >= self.mid)
        r2, d, h = step_terms(z, jz, z_after, self.lr, self.weight_decay)
        d_decay = (z * jz_decay).sum(1).double().numpy() / self.lr + self.weight_decay * r2
        self._sums[half] += np.stack([r2, np.sqrt(r2), d, h, d_decay])
        self._steps[half] += 1
        self._final[half] = np.sqrt((z_after * z_after).sum(1).double().numpy())
        self._balance += _balance_terms(z, jz, z_after)

    @property
    def balance(self) -> dict[str, float]:
        """Window means, over steps and items, of the terms that make up the measured change of r^2.

        ``measured`` = ``first_order`` (2 <z, JVP>: decay and drift) + ``tangential`` (the heat term,
        ||tangential displacement||^2) + ``radial_squared`` + ``second_order`` (2 <z, displacement - JVP>).
        The formula keeps the first two; the last two are what it leaves out.
        """
        steps = max(self._steps.sum(), 1.0)
        means = self._balance.mean(1) / steps
        return dict(zip(BALANCE_TERMS, means.tolist(), strict=True))

    def estimates(self, half: int | None = None) -> Estimates:
        """Means over half 0, half 1, or (``None``) the whole window."""
        if half is None:
            sums, steps, final = self._sums.sum(0), self._steps.sum(), self._final[1]
        else:
            sums, steps, final = self._sums[half], self._steps[half], self._final[half]
        if steps == 0:
            raise ValueError("no measured steps in this part of the window: lengthen the run or the window")
        r2, r, d, h, d_decay = sums / steps
        return Estimates(r2, r, d, d_decay, h, final, self.lr, self.weight_decay)


def equilibrium_norm(d: np.ndarray, h: np.ndarray, lr: float, weight_decay: float) -> np.ndarray:
    """sqrt of r^2 = (D + sqrt(D^2 + 2 V^2)) / 2, D = d / lambda, V^2 = eta h / lambda (docs/theory.md section 4).

    Without weight decay there is no equilibrium (the norm only grows): the result is NaN.
    """
    if weight_decay <= 0:
        return np.full(np.shape(d), np.nan)
    big_d = np.asarray(d) / weight_decay
    v2 = lr * np.asarray(h) / weight_decay
    r2 = 0.5 * (big_d + np.sqrt(big_d**2 + 2.0 * v2))
    return np.sqrt(np.maximum(r2, 0.0))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), as scipy.stats.rankdata."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x))
    edges = np.flatnonzero(np.diff(sorted_x)) + 1
    for lo, hi in zip(np.r_[0, edges], np.r_[edges, len(x)], strict=True):
        ranks[order[lo:hi]] = 0.5 * (lo + hi - 1) + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho with average ranks; NaN when either side is constant."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def r2_score(predicted: np.ndarray, observed: np.ndarray) -> float:
    """1 - SS_res / SS_tot of the prediction as is (no fitted scale or offset: it can be negative)."""
    observed = np.asarray(observed, float)
    ss_tot = ((observed - observed.mean()) ** 2).sum()
    return float(1.0 - ((observed - predicted) ** 2).sum() / ss_tot) if ss_tot > 0 else float("nan")


def score(predicted: np.ndarray, observed: np.ndarray) -> dict[str, float]:
    """R^2 (on the norm and on its log) and Spearman of a predicted against an observed norm."""
    ok = np.isfinite(predicted) & (predicted > 0)
    if not ok.all():
        return {"r2": float("nan"), "r2_log": float("nan"), "spearman": float("nan")}
    return {
        "r2": r2_score(predicted, observed),
        "r2_log": r2_score(np.log(predicted), np.log(observed)),
        "spearman": spearman(predicted, observed),
    }
