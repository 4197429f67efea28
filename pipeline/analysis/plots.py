"""The report's plots, as PNG bytes (matplotlib's Agg canvas; no pyplot, no global backend change).

Every plot labels its axes with units and puts the number of points behind it in the title, so a
reader can judge it without the surrounding page.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

NORM_LABEL = "raw embedding norm ‖v‖ (L2 of the pooled vector)"
PROPERTY_LABELS = {
    "zipf": "word frequency (Zipf scale: log10 occurrences per billion words)",
    "min_depth": "WordNet depth (hypernym steps to the root)",
    "n_hypernym_paths": "WordNet hypernym paths (count)",
    "n_direct_hyponyms": "WordNet direct hyponyms (count)",
    "n_all_hyponyms": "WordNet hyponyms, all levels (count)",
    "n_senses": "WordNet noun senses (count)",
    "rating_sd": "rating SD across raters (rating-scale points)",
    "rating_mean": "mean rating (rating-scale points)",
    "label_entropy": "entropy of the annotators' label distribution",
}
STATISTIC_LABELS = {
    "spearman": "Spearman ρ (−1 to 1)",
    "partial_spearman_zipf": "partial Spearman ρ, zipf partialled out (−1 to 1)",
    "partial_spearman_n_tokens": "partial Spearman ρ, token count partialled out (−1 to 1)",
    "pearson_log_norm": "Pearson r with ln(norm) (−1 to 1)",
    "share_hyponym_norm_greater": "share of pairs, hyponym norm larger (0–1)",
    "share_hyponym_norm_greater_zipf_matched": "share of frequency-matched pairs (0–1)",
    "mean_success_at_1": "success@1 (0–1)",
    "mean_success_at_10": "success@10 (0–1)",
    "mean_ndcg_at_10": "nDCG@10 (0–1)",
    "delta_ndcg_at_10_vs_cosine": "nDCG@10 change vs cosine",
    "mean_selective_accuracy": "mean selective accuracy (0–1)",
}
# matplotlib's tab10, which stays distinguishable for the eight lines a trend plot shows at most
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def property_label(prop: str) -> str:
    """Axis label with units for a probe property (the bare name when unknown)."""
    return PROPERTY_LABELS.get(prop, prop)


def statistic_label(statistic: str) -> str:
    """Axis label with range for a results statistic (AUROCs: 0.5 = chance)."""
    if statistic.startswith("auroc_"):
        return f"AUROC of {statistic[6:].replace('_', ' ')} (0.5 = chance)"
    return STATISTIC_LABELS.get(statistic, statistic)


def _figure(width: float = 7.5, height: float = 4.6) -> tuple[Figure, object]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes, cropped to what is drawn plus a margin: a label longer than the layout
    planned for (a long probe set or property name) widens the image instead of being cut at its edge."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pad_inches=0.12)
    return buf.getvalue()


def hexbin(
    x: np.ndarray,
    y: np.ndarray,
    xlabel: str,
    title: str,
    curve: tuple[np.ndarray, np.ndarray] | None = None,
    curve_label: str = "",
    weights: np.ndarray | None = None,
) -> bytes:
    """Density of items in (property, norm) space, with an optional binned-median curve on top.

    ``weights``: each point stands for that many items (a grid cell's count at its centre); the hexagons then
    sum them. Without weights, fewer than 400 points are drawn one by one."""
    fig, ax = _figure()
    if weights is not None or len(x) >= 400:
        by_weight = {} if weights is None else {"C": weights, "reduce_C_function": np.sum}
        hb = ax.hexbin(x, y, gridsize=45, mincnt=1, bins="log", cmap="viridis", **by_weight)
        bar = fig.colorbar(hb, ax=ax, label="items per cell (log scale)")
        # label 1, 2, 5, 10, 20, 50, ... only: every minor tick labelled would overlap
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        bar.ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else "")
        )
    else:
        ax.scatter(x, y, s=10, alpha=0.6, color=COLOURS[0], linewidths=0)
    if curve is not None and len(curve[0]):
        ax.plot(curve[0], curve[1], color="#d1495b", marker="o", lw=2, ms=4, label=curve_label)
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(NORM_LABEL)
    ax.set_title(title, fontsize=10)
    return to_png(fig)


def boxes(levels: list[dict], xlabel: str, title: str) -> bytes:
    """One box plot of the norm per property level (e.g. per WordNet depth), n under each box, from each level's
    ``level``, ``n``, quartiles ``q1``, ``med``, ``q3`` and whisker ends ``whislo``, ``whishi`` (as
    ``sql/report_box_stats.sql`` computes them over every item)."""
    fig, ax = _figure(8.5, 4.6)
    stats = [{k: row[k] for k in ("whislo", "q1", "med", "q3", "whishi")} | {"fliers": []} for row in levels]
    ax.bxp(stats, showfliers=False, medianprops={"color": "#d1495b", "lw": 2})
    ax.set_xticks(range(1, len(levels) + 1))
    ax.set_xticklabels([f"{row['level']:g}\nn={row['n']:,}" for row in levels], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(NORM_LABEL)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return to_png(fig)


def selective_accuracy(curves: dict[str, tuple[np.ndarray, np.ndarray]], full: float, title: str) -> bytes:
    """Accuracy (success@1) against coverage when abstaining on the queries with the lowest signal."""
    fig, ax = _figure()
    for i, (label, (coverage, accuracy)) in enumerate(curves.items()):
        ax.plot(
            100 * coverage,
            100 * accuracy,
            marker="o",
            ms=4,
            lw=2,
            color=COLOURS[i % len(COLOURS)],
            label=label,
        )
    ax.axhline(100 * full, color="#4d4d4d", ls="--", lw=1, label="answer every query")
    ax.set_xlabel("coverage: queries answered (%)")
    ax.set_ylabel("accuracy of answered queries: success@1 (%)")
    ax.set_xlim(0, 102)
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    return to_png(fig)


def alpha_curve(
    alphas: np.ndarray, means: np.ndarray, lows: np.ndarray, highs: np.ndarray, title: str
) -> bytes:
    """nDCG@10 against the exponent alpha of the document norm, with its 95% interval."""
    fig, ax = _figure()
    ax.fill_between(alphas, lows, highs, color=COLOURS[0], alpha=0.2, label="95% interval")
    ax.plot(alphas, means, marker="o", ms=4, lw=2, color=COLOURS[0], label="cos(q, d) · ‖d‖^α")
    ax.axvline(0, color="#4d4d4d", ls="--", lw=1, label="α = 0: plain cosine")
    ax.set_xlabel("α, exponent of the document norm")
    ax.set_ylabel("mean nDCG@10 (0–1)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    return to_png(fig)


def trend(
    releases: list[str], lines: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], ylabel: str, title: str
) -> bytes:
    """One line per (probe set, property) across releases, with 95% intervals where recorded."""
    fig, ax = _figure(8.0, 4.4)
    x = np.arange(len(releases))
    for i, (label, (values, lows, highs)) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        ax.plot(x, values, marker="o", ms=4, lw=1.8, color=colour, label=label)
        ok = np.isfinite(lows) & np.isfinite(highs)
        if ok.any():
            ax.errorbar(
                x[ok],
                values[ok],
                yerr=[values[ok] - lows[ok], highs[ok] - values[ok]],
                fmt="none",
                ecolor=colour,
                capsize=3,
                lw=1,
            )
    ax.set_xticks(x)
    ax.set_xticklabels(releases, rotation=30 if len(releases) > 6 else 0, fontsize=8)
    ax.set_xlabel("release (in audit order)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    ax.set_title(title, fontsize=10)
    return to_png(fig)
