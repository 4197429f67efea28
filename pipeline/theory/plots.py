"""The lab's two figures, rendered with matplotlib's Agg backend to PNG bytes (any storage root takes bytes).

``predicted_vs_observed``: per item, the equilibrium norm predicted from the first half of the window
against the norm observed in the second half, for tables and encoders, plus each run's mean.
``checkpoint_trends``: per checkpoint, Spearman(norm, property) with its CI, and the relation the base
run's predicted norms imply (dashed).
"""

from __future__ import annotations

import io

import polars as pl

__all__ = ["checkpoint_trends", "predicted_vs_observed"]


def new_figure(ncols: int):
    """``(pyplot, figure, axes)``: one row of ``ncols`` panels on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and workers
    import matplotlib.pyplot as plt

    return plt, *plt.subplots(1, ncols, figsize=(4.6 * ncols, 4.2), squeeze=False)


def png_bytes(plt, fig) -> bytes:
    """The figure as PNG bytes; closes it."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def predicted_vs_observed(items: pl.DataFrame, runs: pl.DataFrame) -> bytes:
    """Scatter of predicted against observed norms (log axes, y = x dashed); returns PNG bytes."""
    plt, fig, axes = new_figure(3)
    for ax, kind in zip(axes[0][:2], ("table", "encoder"), strict=True):
        sub = items.filter(pl.col("kind") == kind)
        if sub.height:
            for (label,), grp in sub.group_by("label", maintain_order=True):
                ax.scatter(grp["observed_norm"], grp["predicted_norm"], s=4, alpha=0.5, label=label)
            diagonal_log_axes(ax, sub["observed_norm"], sub["predicted_norm"])
        ax.set_title(f"{kind}: every item of every run")
        ax.set_xlabel("observed norm (second half of window)")
        ax.set_ylabel("predicted norm (from first half)")
    ax = axes[0][2]
    for kind, marker in (("table", "o"), ("encoder", "s")):
        sub = runs.filter(pl.col("kind") == kind)
        if sub.height:
            ax.scatter(sub["mean_norm_observed"], sub["mean_norm_predicted"], marker=marker, label=kind)
    if runs.height:
        diagonal_log_axes(ax, runs["mean_norm_observed"], runs["mean_norm_predicted"])
        ax.legend(fontsize=8)
    ax.set_title("mean norm per run (lr x batch x decay x seed)")
    ax.set_xlabel("observed")
    ax.set_ylabel("predicted")
    return png_bytes(plt, fig)


def diagonal_log_axes(ax, x, y) -> None:
    """Dashed y = x over the data's range, both axes logarithmic with plain-number labels."""
    lo = min(float(x.min()), float(y.min())) * 0.9
    hi = max(float(x.max()), float(y.max())) * 1.1
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        # plain numbers: norms span well under a decade, where 10^x labels collide
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())


def checkpoint_trends(checkpoints: pl.DataFrame, implied: dict[str, float]) -> bytes:
    """Spearman(norm, property) per checkpoint step with CI bars; ``implied`` draws dashed levels."""
    props = list(dict.fromkeys(checkpoints["property"].to_list())) if checkpoints.height else list(implied)
    plt, fig, axes = new_figure(max(1, len(props)))
    for ax, prop in zip(axes[0], props, strict=False):
        sub = checkpoints.filter(pl.col("property") == prop).sort("step")
        if sub.height:
            low = (sub["value"] - sub["ci_low"]).fill_null(0.0)
            high = (sub["ci_high"] - sub["value"]).fill_null(0.0)
            ax.errorbar(sub["step"], sub["value"], yerr=[low, high], marker="o", capsize=3, label="audit")
        if prop in implied:
            ax.axhline(implied[prop], ls="--", color="k", lw=0.8, label="implied by predicted norms")
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_title(f"Spearman(norm, {prop})")
        ax.set_xlabel("training step (release)")
        ax.set_ylim(-1, 1)
        ax.legend(fontsize=8)
    return png_bytes(plt, fig)
