"""The free-embedding step identity of docs/theory.md section 2, checked on every row at every step.

One plain SGD step with learning rate eta and L2 decay lambda on a lookup-table row z gives

    r'^2 = (1 - eta*lambda)^2 * r^2 + eta^2 * ||g||^2 / r^2,      g = r * dL/dz (the spherical gradient)

exactly, because dL/dz is orthogonal to z for a scale-invariant loss. The check trains a float64 table
with ``torch.optim.SGD`` on InfoNCE batches from the world and compares the observed change of every
row's squared norm with the identity's change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.theory.encoder import TrainConfig, build_model, info_nce
from pipeline.theory.world import World

__all__ = ["IdentityConfig", "IdentityResult", "check_identity"]


class IdentityConfig(BaseModel):
    """Length and optimiser settings of the identity check (one run per weight decay)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(200, ge=1)
    lr: float = Field(1.0, gt=0)
    weight_decays: tuple[float, ...] = (0.0, 0.01)
    batch_size: int = Field(32, ge=2)
    temperature: float = Field(0.2, gt=0)
    dim: int = Field(16, ge=2)
    seed: int = 0


@dataclass(frozen=True)
class IdentityResult:
    """Worst relative error of the identity over all rows and steps, per weight decay."""

    weight_decay: float
    steps: int
    max_rel_error: float  # max |observed - identity| / |observed| of the change of r^2 (changed rows)
    max_abs_error: float  # the same difference relative to r^2 (every row)
    max_radial_cosine: float  # max |cos(z, dL/dz)|: how orthogonal the gradient was
    rows_checked: int  # (row, step) pairs whose norm changed


def check_identity(world: World, cfg: IdentityConfig, weight_decay: float) -> IdentityResult:
    """Train a float64 lookup table with SGD and compare every row's step with the identity."""
    import torch

    train_cfg = TrainConfig(kind="table", dim=cfg.dim, lr=cfg.lr, batch_size=cfg.batch_size,
                            weight_decay=weight_decay, temperature=cfg.temperature, seed=cfg.seed, steps=4)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = build_model(train_cfg, world.n_items)
    table = model.table
    opt = torch.optim.SGD([table], lr=cfg.lr, weight_decay=weight_decay)
    rng = np.random.default_rng([cfg.seed, world.config.seed, 7])
    rel = absolute = radial = 0.0
    checked = 0
    for _ in range(cfg.steps):
        anchors = world.sample_anchors(rng, cfg.batch_size)
        positives = world.sample_positives(rng, anchors)
        opt.zero_grad(set_to_none=False)
        info_nce(table[anchors], table[positives], cfg.temperature).backward()
        with torch.no_grad():
            r2 = (table * table).sum(1)
            grad = table.grad
            grad2 = (grad * grad).sum(1)
            shrink = (1.0 - cfg.lr * weight_decay) ** 2
            # the identity's change of r^2: (1-eta*lambda)^2 r^2 + eta^2 ||g||^2 / r^2 - r^2,
            # where ||g||^2 / r^2 = ||dL/dz||^2
            expected = (shrink - 1.0) * r2 + cfg.lr**2 * grad2
            cos = (table * grad).sum(1).abs() / (r2.sqrt() * grad2.sqrt()).clamp_min(1e-300)
            opt.step()
            observed = (table * table).sum(1) - r2
        err = (observed - expected).abs()
        changed = (observed != 0) | (expected != 0)
        checked += int(changed.sum())
        if changed.any():
            rel = max(rel, float((err[changed] / observed[changed].abs().clamp_min(1e-300)).max()))
        absolute = max(absolute, float((err / r2).max()))
        radial = max(radial, float(cos[grad2 > 0].max()) if (grad2 > 0).any() else 0.0)
    return IdentityResult(weight_decay, cfg.steps, rel, absolute, radial, checked)
