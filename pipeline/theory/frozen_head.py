"""A linear head on frozen MiniLM features, trained where the balance's assumptions hold (issue 35, part 1).

The encoder is frozen; the only trained parameter is a linear map W (``dim`` × 384), applied to the features of
both sides of a reverse-dictionary pair (definition → lemma), z = W x. The loss is symmetric InfoNCE on cosine
similarity, so it is scale invariant in every z and hence in W: plain SGD with L2 weight decay (coupled, as the
balance assumes) and a constant step reaches an equilibrium after a few 1/(ηλ) steps, and the heat does not scale
with the norm (the gradient of W falls as 1/‖W‖ while r grows as ‖W‖, so r² ‖Δz_tangential‖² / η² is scale free).

Per-item terms are exact, not estimated: z is linear in W, so the displacement of an item in one step,
Δz = ΔW x, *is* the JVP along the update, and :func:`pipeline.theory.estimators.step_terms` gets d and h with
no approximation (the balance's only omission is the squared radial displacement, second order in η).
The displacement of the measured items is computed through the features' Gram matrix (Δz_i = −ηλ z_i − η Σ_b
⟨x_i, x_b⟩ ∂L/∂z_b, the empirical NTK of a linear model), so a step costs little more than the batch's own.

A run: ``relax``/(ηλ) steps of burn-in, then a window of ``window``/(ηλ) steps measured at every step; its first
half gives each item's d and h (:class:`pipeline.theory.estimators.NormTracker`), its second half the norms
they are scored against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.theory.estimators import NormTracker
from pipeline.theory.trace import TraceEncoder

__all__ = ["HeadRun", "head_features", "train_head"]


@dataclass(frozen=True)
class HeadRun:
    """One run of the frozen-feature head: step size, decay, seed and how long it trains."""

    lr: float
    weight_decay: float
    seed: int = 0
    dim: int = 64  # output dimension of the head
    batch: int = 64  # pairs per step; the other pairs are each pair's negatives
    temperature: float = 0.1
    relax: float = 10.0  # burn-in, in units of 1/(eta lambda): the issue asks for at least 10
    window: float = 4.0  # measured window, in units of 1/(eta lambda)
    min_window: int = 400  # at least this many measured steps, whatever eta lambda is

    @property
    def burn_in(self) -> int:
        return math.ceil(self.relax / (self.lr * self.weight_decay))

    @property
    def window_steps(self) -> int:
        n = max(self.min_window, math.ceil(self.window / (self.lr * self.weight_decay)))
        return n + n % 2  # two equal halves

    @property
    def steps(self) -> int:
        return self.burn_in + self.window_steps


def head_features(model, pairs, n_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Raw pooled MiniLM vectors (before ``Normalize``, as the audit stores them) of ``n_pairs`` reverse-dictionary
    pairs drawn with ``seed``: ``(definitions [n, 384], lemmas [n, 384], lemma list)``, float32.

    ``pairs`` is :func:`pipeline.probes.splits.reverse_dictionary_pairs`' frame (one row per lemma, so no lemma
    is drawn twice and no pair is another's false negative).
    """
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(pairs.height, n_pairs, replace=False))
    chosen = pairs[pick]
    defs = TraceEncoder(model, chosen["definition"].to_list()).vectors()
    lems = TraceEncoder(model, chosen["word"].to_list()).vectors()
    return defs, lems, chosen["word"].to_list()


def _info_nce(za, zb, temperature: float):
    """Symmetric InfoNCE on cosine similarity: scale invariant in every row of ``za`` and ``zb``."""
    import torch

    ua = za / za.norm(dim=1, keepdim=True)
    ub = zb / zb.norm(dim=1, keepdim=True)
    logits = ua @ ub.T / temperature
    target = torch.arange(za.shape[0])
    return 0.5 * (torch.nn.functional.cross_entropy(logits, target)
                  + torch.nn.functional.cross_entropy(logits.T, target))


def train_head(defs: np.ndarray, lems: np.ndarray, measured: np.ndarray, run: HeadRun) -> dict:
    """Train the head of ``run`` on the pairs (``defs[i]``, ``lems[i]``) and measure the ``measured`` items.

    Returns the window's halves as :class:`~pipeline.theory.estimators.Estimates` (``first``, ``second``),
    the measured items' norms after every window step (``norms`` [window, M], float64) with their step
    numbers (``steps``), the per-step heat of the fit half and the norms before those steps (``heat``,
    ``r_before``, [window/2, M]), the mean loss of the window, the final weights (``weights``) and their
    norm, and the window's r² balance (:attr:`~pipeline.theory.estimators.NormTracker.balance`).
    """
    import torch

    gen = np.random.default_rng([run.seed, 35])
    X = torch.from_numpy(np.concatenate([defs, lems]).astype(np.float64))
    n = defs.shape[0]
    Xm = torch.from_numpy(np.asarray(measured, np.float64))
    gram = Xm @ X.T  # [M, 2n]: <x_i, x_b>, the linear model's empirical NTK up to the identity on outputs
    torch.manual_seed(run.seed)
    W = torch.randn(run.dim, X.shape[1], dtype=torch.float64) / math.sqrt(X.shape[1])
    eta, lam = run.lr, run.weight_decay
    tracker = NormTracker(Xm.shape[0], eta, lam, run.burn_in, run.steps)
    half = run.window_steps // 2
    norms = np.empty((run.window_steps, Xm.shape[0]))
    heat = np.empty((half, Xm.shape[0]))
    r_before = np.empty((half, Xm.shape[0]))
    losses = []
    z = None
    per_epoch = n // run.batch
    order = gen.permutation(n)
    for step in range(run.steps):
        k = step % per_epoch
        if k == 0 and step:
            order = gen.permutation(n)
        b = torch.from_numpy(order[k * run.batch:(k + 1) * run.batch])
        za = (X[b] @ W.T).requires_grad_(True)
        zb = (X[b + n] @ W.T).requires_grad_(True)
        loss = _info_nce(za, zb, run.temperature)
        ga, gb = torch.autograd.grad(loss, (za, zb))
        grad_w = ga.T @ X[b] + gb.T @ X[b + n]
        W_new = (1 - eta * lam) * W - eta * grad_w
        if step >= run.burn_in:
            if z is None:
                z = Xm @ W.T
            # exact displacement of every measured item: decay plus the batch's pull through the Gram matrix
            dz = -eta * lam * z - eta * (gram[:, b] @ ga + gram[:, b + n] @ gb)
            z_after = z + dz
            tracker.update(step, z, dz, z_after, -eta * lam * z)
            i = step - run.burn_in
            norms[i] = z_after.norm(dim=1).numpy()
            if i < half:
                r2 = (z * z).sum(1)
                tang = dz - ((dz * z).sum(1) / r2)[:, None] * z
                heat[i] = (r2 * (tang * tang).sum(1) / eta**2).numpy()
                r_before[i] = r2.sqrt().numpy()
            losses.append(float(loss.detach()))
            z = z_after
        W = W_new
    return {"first": tracker.estimates(0), "second": tracker.estimates(1), "norms": norms,
            "steps": np.arange(run.burn_in + 1, run.steps + 1), "heat": heat, "r_before": r_before,
            "loss": float(np.mean(losses)), "w_norm": float(W.norm()), "weights": W.numpy(),
            "balance": tracker.balance}
