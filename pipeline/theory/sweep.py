"""Score training runs against the equilibrium formula: one results row per run, one row per item.

Every score is out of sample (docs/theory.md section 6): ``half`` = estimates from the first half of the
measuring window predict the second half's mean norms; ``seed`` = one seed's whole-window estimates
predict the other seed's. Next to the formula sit the references that make its numbers readable:
``heat_only`` (d = 0), ``const_heat`` (h replaced by its mean: the ablation a broken estimator resembles),
``persistence`` (the first half's observed norms as the prediction: what simply carrying the norm over
achieves) and ``in_sample`` (estimates and norms from the same steps: bookkeeping, shown so nobody
mistakes it for evidence).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

from pipeline.theory.encoder import TrainConfig, TrainResult, train
from pipeline.theory.estimators import score, spearman
from pipeline.theory.world import World

__all__ = ["PROPERTIES", "item_frame", "run_pair", "score_run"]

PROPERTIES = ("depth", "log_frequency", "ambiguity")


def _props(world: World) -> dict[str, np.ndarray]:
    return {"depth": world.depth.astype(float), "log_frequency": np.log(world.prob),
            "ambiguity": world.ambiguity}


def _prefixed(prefix: str, scores: dict[str, float], keep: tuple[str, ...] = ("r2", "spearman")) -> dict:
    return {f"{prefix}{k}": scores[k] for k in keep}


def score_run(world: World, res: TrainResult, other: TrainResult) -> dict:
    """The results row of ``res``; ``other`` is the same grid point trained with the other seed."""
    cfg = res.config
    first, second, whole = (res.tracker.estimates(h) for h in (0, 1, None))
    other_whole = other.tracker.estimates()
    predicted, observed = first.predicted_norm(), second.norm
    balance = res.tracker.balance
    tail = max(1, len(res.losses) // 10)
    row = {
        "label": cfg.label(), "kind": cfg.kind, "lr": cfg.lr, "batch_size": cfg.batch_size,
        "weight_decay": cfg.weight_decay, "temperature": cfg.temperature, "seed": cfg.seed,
        "steps": cfg.steps, "window_start": cfg.window_start, "n_items": world.n_items,
        "seconds": res.seconds, "loss_start": float(res.losses[:tail].mean()),
        "loss_end": float(res.losses[-tail:].mean()),
        "mean_norm_observed": float(observed.mean()), "mean_norm_predicted": float(predicted.mean()),
        **_prefixed("", score(predicted, observed), ("r2", "r2_log", "spearman")),
        **_prefixed("final_", score(predicted, second.final_norm)),
        **_prefixed("seed_", score(whole.predicted_norm(), other_whole.norm)),
        **_prefixed("heat_only_", score(first.predicted_norm(d=np.zeros_like(first.d)), observed)),
        **_prefixed("const_heat_", score(first.predicted_norm(h=np.full_like(first.h, first.h.mean())),
                                         observed)),
        **_prefixed("persistence_", score(first.norm, observed)),
        **_prefixed("in_sample_", score(whole.predicted_norm(), whole.norm)),
        # effective decay in units of lambda (item means, so the two parts add up to the total): what the
        # decay of shared weights contributes, and what the other items' gradients add on top
        "lambda_eff_over_lambda": float(whole.lambda_eff.mean() / cfg.weight_decay),
        "lambda_eff_decay_over_lambda": float(whole.lambda_eff_decay.mean() / cfg.weight_decay),
        "lambda_eff_gradient_over_lambda": float((whole.lambda_eff - whole.lambda_eff_decay).mean()
                                                 / cfg.weight_decay),
        **{f"balance_{k}": v for k, v in balance.items()},
        # share of the measured r^2 balance the formula leaves out, relative to its heat term
        "missing_over_heat": (balance["radial_squared"] + balance["second_order"]) / balance["tangential"],
    }
    for name, values in _props(world).items():
        row[f"observed_spearman_{name}"] = spearman(observed, values)
        row[f"predicted_spearman_{name}"] = spearman(predicted, values)
    return row


def item_frame(world: World, res: TrainResult) -> pl.DataFrame:
    """Per item: properties, the first half's d, h and predicted norm, the second half's observed norm."""
    first, second = res.tracker.estimates(0), res.tracker.estimates(1)
    cfg = res.config
    return pl.DataFrame({
        "label": cfg.label(), "kind": cfg.kind, "seed": cfg.seed,
        "item_id": world.tokens, **_props(world),
        "d": first.d, "h": first.h, "lambda_eff": first.lambda_eff,
        "predicted_norm": first.predicted_norm(), "observed_norm": second.norm,
        "final_norm": second.final_norm,
    })


def run_pair(
    world: World,
    pair: tuple[TrainConfig, TrainConfig],
    checkpoint_steps: tuple[int, ...] = (),
    on_checkpoint: Callable[[int, object], None] | None = None,
) -> tuple[list[dict], pl.DataFrame]:
    """Train both seeds of one grid point and score each against the other.

    Checkpoints, if asked for, are saved from the first seed's run. Returns the two results rows and the
    per-item frame of both runs.
    """
    first = train(world, pair[0], checkpoint_steps, on_checkpoint)
    second = train(world, pair[1])
    rows = [score_run(world, first, second), score_run(world, second, first)]
    items = pl.concat([item_frame(world, first), item_frame(world, second)])
    return rows, items
