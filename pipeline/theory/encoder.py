"""The lab's two models (a free lookup table and a table + MLP encoder) and their InfoNCE training.

Training is plain ``torch.optim.SGD`` with L2 weight decay, in float64, on a symmetric InfoNCE loss over
cosine similarities: the loss sees each embedding only through its direction (docs/theory.md section 1), so
everything that moves a norm is the finite step, the decay, or parameters shared with other items.
During the last ``window`` share of the steps every item is measured at every step (docs/theory.md section 6:
subsampling destroys the estimate) and handed to a :class:`~pipeline.theory.estimators.NormTracker`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.theory.estimators import NormTracker
from pipeline.theory.world import World

__all__ = ["TrainConfig", "TrainResult", "build_model", "info_nce", "train"]


class TrainConfig(BaseModel):
    """One training run: model shape, optimiser, loss temperature, length and measuring window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["table", "encoder"] = "encoder"
    dim: int = Field(16, ge=2, description="table row width (the encoder's input)")
    hidden: int = Field(32, ge=2, description="encoder MLP hidden width")
    out_dim: int = Field(16, ge=2, description="encoder output width")
    lr: float = Field(1.0, gt=0)
    batch_size: int = Field(64, ge=2)
    weight_decay: float = Field(0.002, ge=0)
    temperature: float = Field(0.2, gt=0)
    steps: int = Field(2000, ge=4)
    window: float = Field(0.5, gt=0, le=1, description="last share of steps where d, h and norms average")
    init_scale: float = Field(1.0, gt=0, description="initial table rows have norm about init_scale")
    seed: int = 0

    @property
    def window_start(self) -> int:
        """First measured step (the window is split into two halves of whole steps)."""
        return self.steps - max(2, math.ceil(self.window * self.steps))

    def label(self) -> str:
        """A short, path-safe name for this run's hyper-parameters."""
        return (f"{self.kind}-lr{self.lr:g}-b{self.batch_size}-wd{self.weight_decay:g}-s{self.seed}"
                .replace("+", ""))


def build_model(cfg: TrainConfig, n_items: int):
    """A float64 :class:`~pipeline.theory.models.Table` or :class:`~pipeline.theory.models.Encoder`."""
    from pipeline.theory.models import Encoder, Table  # lazy: they subclass torch.nn.Module (torch import)

    if cfg.kind == "table":
        return Table(n_items, cfg.dim, cfg.init_scale)
    return Encoder(n_items, cfg.dim, cfg.hidden, cfg.out_dim, cfg.init_scale)


def info_nce(za, zp, temperature: float):
    """Symmetric InfoNCE over in-batch negatives on cosine similarity (scale invariant in every row)."""
    import torch
    import torch.nn.functional as F

    a = za / torch.linalg.vector_norm(za, dim=1, keepdim=True)
    p = zp / torch.linalg.vector_norm(zp, dim=1, keepdim=True)
    logits = a @ p.T / temperature
    labels = torch.arange(len(za))
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


@dataclass
class TrainResult:
    """What a run leaves behind: the trained module, the tracker's estimates and the loss curve."""

    config: TrainConfig
    model: object
    tracker: NormTracker
    losses: np.ndarray
    seconds: float


def train(
    world: World,
    cfg: TrainConfig,
    checkpoint_steps: tuple[int, ...] = (),
    on_checkpoint: Callable[[int, object], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train ``cfg`` on ``world`` and measure d_i, h_i and the norms over the window.

    ``on_checkpoint(step, model)`` is called after each step listed in ``checkpoint_steps`` (0 = the
    initial model, before any update). Returns a :class:`TrainResult`.
    """
    import torch

    t0 = time.perf_counter()
    rng = np.random.default_rng([cfg.seed, world.config.seed])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = build_model(cfg, world.n_items)
    names, params = zip(*model.named_parameters(), strict=True)
    opt = torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ids = torch.arange(world.n_items)
    tracker = NormTracker(world.n_items, cfg.lr, cfg.weight_decay, cfg.window_start, cfg.steps)
    losses = np.empty(cfg.steps)
    if 0 in checkpoint_steps and on_checkpoint:
        on_checkpoint(0, model)
    for step in range(cfg.steps):
        anchors = world.sample_anchors(rng, cfg.batch_size)
        positives = world.sample_positives(rng, anchors)
        z = model(ids)
        loss = info_nce(z[anchors], z[positives], cfg.temperature)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        losses[step] = loss.item()
        measuring = step >= cfg.window_start
        old = {n: p.detach().clone() for n, p in zip(names, params, strict=True)} if measuring else None
        opt.step()
        if measuring:
            with torch.no_grad():
                delta = {n: p - old[n] for n, p in zip(names, params, strict=True)}
                # at the parameters *before* the step: where the update was computed
                jz = model.jvp(ids, delta, at=old)
                # the decay part of SGD's update alone (-eta*lambda*theta): splits d into decay and gradients
                decay = {n: -cfg.lr * cfg.weight_decay * o for n, o in old.items()}
                jz_decay = model.jvp(ids, decay, at=old)
                z_after = model(ids)
            tracker.update(step, z.detach(), jz, z_after, jz_decay)
        if on_checkpoint and step + 1 in checkpoint_steps:
            on_checkpoint(step + 1, model)
        if progress and (step + 1) % 500 == 0:
            progress(step + 1)
    if not np.isfinite(losses).all():
        raise FloatingPointError(f"{cfg.label()}: the loss diverged; lower lr or raise temperature")
    return TrainResult(cfg, model, tracker, losses, time.perf_counter() - t0)
