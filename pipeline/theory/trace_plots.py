"""Figures of a fine-tune's training trace, as PNG bytes (matplotlib's Agg backend, as :mod:`plots`).

``norm_trajectories``: mean norm per traced step of the nouns by zipf quartile and of the test definitions.
``formula_scatter``: per item, the formula's and persistence's predictions against the observed norm.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.theory.plots import diagonal_log_axes, new_figure, png_bytes

__all__ = ["formula_scatter", "norm_trajectories"]


def norm_trajectories(runs: dict[str, pl.DataFrame], zipf: pl.DataFrame) -> bytes:
    """One panel per run: mean norm by step for each zipf quartile of the nouns and for the definitions.

    ``runs`` maps a title to its trace; ``zipf`` has ``item_id`` and ``zipf`` of the nouns.
    """
    plt, fig, axes = new_figure(len(runs))
    for ax, (title, trace) in zip(axes[0], runs.items(), strict=True):
        nouns = trace.filter(pl.col("kind") == "noun").join(zipf, on="item_id")
        edges = np.quantile(nouns["zipf"].to_numpy(), [0.25, 0.5, 0.75])
        nouns = nouns.with_columns(pl.col("zipf").cut(edges.tolist(), labels=[
            "nouns, zipf Q1 (rare)", "nouns, zipf Q2", "nouns, zipf Q3", "nouns, zipf Q4 (frequent)"]).alias("bin"))
        groups = [(str(b), g) for (b,), g in nouns.group_by("bin")]
        groups.sort()
        groups.append(("test definitions", trace.filter(pl.col("kind") == "definition")))
        for label, grp in groups:
            line = grp.group_by("step").agg(pl.col("norm").mean()).sort("step")
            ax.plot(line["step"], line["norm"], label=label)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("mean raw norm")
        ax.legend(fontsize=7)
    return png_bytes(plt, fig)


def formula_scatter(runs: dict[str, pl.DataFrame]) -> bytes:
    """One panel per run: observed second-half norm (x) against the formula and persistence (y), log axes.

    ``runs`` maps a title to :func:`pipeline.theory.trace_formula.formula_predictions`' items.
    """
    plt, fig, axes = new_figure(len(runs))
    for ax, (title, items) in zip(axes[0], runs.items(), strict=True):
        for column, marker in (("formula", "o"), ("persistence", "x")):
            ax.scatter(items["second_half"], items[column], s=5, alpha=0.5, marker=marker, label=column)
        diagonal_log_axes(ax, items["second_half"], pl.concat([items["formula"], items["persistence"]]))
        ax.set_title(title)
        ax.set_xlabel("observed norm (second half)")
        ax.set_ylabel("predicted (first half)")
        ax.legend(fontsize=7)
    return png_bytes(plt, fig)
