"""Per-module rotational equilibrium of a real encoder (issue 35, part 4).

Each weight tensor W with decay λ and step η moves as W' = (1 − ηλ) W + U, where U is the optimizer's own step
(−η g for SGD, whose coupled decay gives the same factor; −η m̂/(√v̂ + ε) for AdamW, whose decay is decoupled).
So exactly

    ‖W'‖² = (1 − ηλ)² ‖W‖² + 2 (1 − ηλ) ⟨W, U⟩ + ‖U‖²

:func:`module_norm_recorder` records ‖W‖², ‖U‖² and ⟨W, U⟩ of every parameter at every optimizer step (a trainer
callback: the parameters are copied before the step and compared after it). The equilibria it is scored against
assume U ⟂ W (true for weights the loss cannot see the scale of; the recorded radial cosine says how far from it
each tensor is) and differ in how ‖U‖ scales with ‖W‖:

- **AdamW** (Kosson et al., *Rotational equilibrium*, 2024): Adam's step is normalised, so ‖U‖ does not depend on
  ‖W‖ and ‖W‖² = E‖U‖² / (2ηλ − η²λ²); with their assumption E‖U‖² = η² C (C elements of unit-RMS step),
  ‖W‖ = √(ηC / (2λ)) to first order.
- **SGD** (spherical motion dynamics, Wan et al., 2021): for a scale-invariant weight ‖g‖ ∝ 1/‖W‖, so ‖W‖²‖U‖²
  is scale free and ‖W‖⁴ = E[‖W‖²‖U‖²] / (2ηλ − η²λ²).

:func:`module_equilibria` takes the terms from one window of the run and the observed norm from a later one.
"""

from __future__ import annotations

import numpy as np
import polars as pl

__all__ = ["module_equilibria", "module_norm_recorder"]


def module_norm_recorder():
    """A trainer callback that records, per parameter and optimizer step, ‖W‖² before the step, ‖U‖² and ⟨W, U⟩
    of the optimizer's own step U (the update minus the decay, −ηλW, of the parameter's group) and ‖W‖² after.

    Its ``frame()`` returns the rows (``step, name, numel, lr, weight_decay, w2, u2, wu, w2_after``). Built in a
    function so that transformers is imported only by the runs that use it.
    """
    import torch
    from transformers import TrainerCallback

    class ModuleNormRecorder(TrainerCallback):
        def __init__(self) -> None:
            self._before: dict[str, torch.Tensor] = {}
            self.rows: list[dict] = []

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            # a parameter without a gradient (MiniLM's unused pooler) is skipped by the optimizer: no step, no decay
            self._before = {name: p.detach().clone() for name, p in model.named_parameters() if p.grad is not None}

        def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
            step = state.global_step + 1  # global_step counts finished steps; this one finishes now
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name not in self._before:
                        continue
                    group = groups[id(p)]
                    w0, w1 = self._before[name].double(), p.detach().double()
                    u = w1 - w0 + group["lr"] * group["weight_decay"] * w0
                    self.rows.append({"step": step, "name": name, "numel": p.numel(), "lr": float(group["lr"]),
                                      "weight_decay": float(group["weight_decay"]), "w2": float((w0 * w0).sum()),
                                      "u2": float((u * u).sum()), "wu": float((w0 * u).sum()),
                                      "w2_after": float((w1 * w1).sum())})
            self._before = {}

        def frame(self) -> pl.DataFrame:
            return pl.DataFrame(self.rows)

    return ModuleNormRecorder()


def module_equilibria(frame: pl.DataFrame, optimizer: str, fit: tuple[int, int], target: tuple[int, int],
                      tolerance: float = 0.1) -> pl.DataFrame:
    """Per decayed parameter: the equilibrium norm its ``fit`` steps predict, against its mean norm over the
    ``target`` steps (both ranges inclusive, in optimizer steps).

    Columns: ``name, numel, observed`` (mean ‖W‖ after the target steps), ``predicted`` (the optimizer's law,
    module docstring), ``kosson`` (√(ηC/(2λ)), AdamW only), ``ratio`` (observed / predicted), ``reached``
    (|ratio − 1| ≤ ``tolerance``), ``moved`` (‖W‖ at the target's end over its start, − 1), ``radial_cos``
    (mean ⟨W, U⟩ / (‖W‖ ‖U‖) over the fit steps: 0 where the equilibrium's U ⟂ W holds) and ``steps_to_eq``
    (1/(2ηλ), the relaxation time of ‖W‖²).
    """
    decayed = frame.filter(pl.col("weight_decay") > 0)
    fit_rows = decayed.filter(pl.col("step").is_between(*fit))
    tgt = decayed.filter(pl.col("step").is_between(*target)).sort("step")
    terms = fit_rows.group_by("name").agg(
        pl.col("numel").first(), pl.col("lr").first().alias("eta"), pl.col("weight_decay").first().alias("lam"),
        pl.col("u2").mean(), (pl.col("w2") * pl.col("u2")).mean().alias("w2u2"),
        (pl.col("wu") / (pl.col("w2") * pl.col("u2")).sqrt()).mean().alias("radial_cos"))
    obs = tgt.group_by("name").agg(pl.col("w2_after").sqrt().mean().alias("observed"),
                                   (pl.col("w2_after").last() / pl.col("w2_after").first()).sqrt().alias("moved"))
    out = terms.join(obs, on="name")
    eta, lam = out["eta"].to_numpy(), out["lam"].to_numpy()
    denom = 2 * eta * lam - (eta * lam) ** 2  # 1 − (1 − ηλ)²
    if optimizer == "adamw":
        predicted = np.sqrt(out["u2"].to_numpy() / denom)
        kosson = np.sqrt(eta * out["numel"].to_numpy() / (2 * lam))
    else:
        predicted = (out["w2u2"].to_numpy() / denom) ** 0.25
        kosson = np.full(out.height, np.nan)
    ratio = out["observed"].to_numpy() / predicted
    return out.select("name", "numel", "observed", "radial_cos").with_columns(
        pl.Series("predicted", predicted), pl.Series("kosson", kosson), pl.Series("ratio", ratio),
        pl.Series("reached", np.abs(ratio - 1) <= tolerance), pl.Series("moved", out["moved"].to_numpy() - 1),
        pl.Series("steps_to_eq", 1 / (2 * eta * lam)),
    ).sort("name")
