"""Issue 28's grid, summarised: per statistic, how fine-tuning moved it across seeds, semantic pairs against
shuffled ones, with t intervals over seeds; and the figure of each statistic against the training step.

The inputs are plain tables the benchmark (``benchmarks/imprint.py``) reads from the store: ``changes`` (one
row per run and statistic: the paired engine's step-0 value, last value, difference and its paired 95%
interval) and ``values`` (one row per run, checkpoint step and statistic, from ``results``).

Across seeds the mean change gets a Student t interval (``n - 1`` degrees of freedom: the seeds are the
replicates, so seed noise is what the interval measures); semantic minus shuffled gets Welch's interval
(unequal variances, Welch-Satterthwaite degrees of freedom).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline.theory.plots import new_figure, png_bytes

__all__ = ["STATISTICS", "imprint_figure", "seed_table", "t_interval", "welch_interval"]

# (key, label, analysis, probe_set, property, statistic): what the table and the figures report, in this order
STATISTICS = (
    ("hyponym_share_zipf", "pairs · hyponym-longer share, zipf-matched", "hypernym_pairs", "wordnet-pairs",
     "hypernym_of", "share_hyponym_norm_greater_zipf_matched"),
    ("depth_given_zipf", "nouns · partial ρ(norm, min_depth | zipf)", "norm_vs_property", "wordnet-nouns",
     "min_depth", "partial_spearman_zipf"),
    ("senses_given_zipf", "nouns · partial ρ(norm, n_senses | zipf)", "norm_vs_property", "wordnet-nouns",
     "n_senses", "partial_spearman_zipf"),
    ("zipf", "nouns · ρ(norm, zipf)", "norm_vs_property", "wordnet-nouns", "zipf", "spearman"),
    ("success_at_10", "unseen definitions · success@10", "retrieval_calibration", "wordnet-reverse-dictionary-test",
     "retrieval", "mean_success_at_10"),
)


def t_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``x`` and its Student t interval (nan bounds for fewer than two values)."""
    from scipy import stats

    x = np.asarray(x, float)
    mean = float(x.mean()) if x.size else float("nan")
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return mean, mean - half, mean + half


def welch_interval(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """``mean(a) - mean(b)`` and Welch's t interval of it (nan bounds when either has fewer than two values)."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    diff = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return diff, float("nan"), float("nan")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = np.sqrt(va + vb)
    if se == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return diff, diff - half, diff + half


def seed_table(changes: pl.DataFrame) -> pl.DataFrame:
    """One row per statistic and optimizer: step-0 value, mean last value and mean change per arm with t
    intervals, how many seeds' paired intervals exclude 0, and semantic minus shuffled (Welch).

    ``changes`` has ``key, optimizer, arm, seed, base_value, value, difference, ci_low, ci_high``.
    """
    rows = []
    for key, label, *_ in STATISTICS:
        for optimizer in sorted(changes.filter(pl.col("key") == key)["optimizer"].unique()):
            sub = changes.filter((pl.col("key") == key) & (pl.col("optimizer") == optimizer))
            row = {"key": key, "statistic": label, "optimizer": optimizer,
                   "step0": float(sub["base_value"].mean())}
            diffs = {}
            for arm in ("semantic", "shuffled"):
                arm_rows = sub.filter(pl.col("arm") == arm)
                diffs[arm] = arm_rows["difference"].to_numpy()
                mean, lo, hi = t_interval(diffs[arm])
                excl = ((arm_rows["ci_low"] > 0) | (arm_rows["ci_high"] < 0)).sum()
                row |= {f"{arm}_last": float(arm_rows["value"].mean()) if arm_rows.height else float("nan"),
                        f"{arm}_change": mean, f"{arm}_low": lo, f"{arm}_high": hi, f"{arm}_seeds": arm_rows.height,
                        f"{arm}_seeds_differ": int(excl)}
            if diffs["semantic"].size and diffs["shuffled"].size:
                d, lo, hi = welch_interval(diffs["semantic"], diffs["shuffled"])
            else:
                d = lo = hi = float("nan")
            row |= {"semantic_minus_shuffled": d, "sms_low": lo, "sms_high": hi}
            rows.append(row)
    return pl.DataFrame(rows)


def imprint_figure(values: pl.DataFrame, key: str, title: str) -> bytes:
    """One panel per optimizer: the statistic against the checkpoint step, mean over seeds (line) and the
    seeds' range (band), semantic and shuffled arms; PNG bytes.

    ``values`` has ``key, optimizer, arm, seed, step, value`` (step 0 repeated for every run).
    """
    sub = values.filter(pl.col("key") == key)
    optimizers = sorted(sub["optimizer"].unique())
    plt, fig, axes = new_figure(max(1, len(optimizers)))
    for ax, optimizer in zip(axes[0], optimizers, strict=False):
        for arm, color in (("semantic", "tab:blue"), ("shuffled", "tab:orange")):
            grp = sub.filter((pl.col("optimizer") == optimizer) & (pl.col("arm") == arm))
            if grp.height == 0:
                continue
            per_step = grp.group_by("step").agg(
                pl.col("value").mean().alias("mean"), pl.col("value").min().alias("lo"),
                pl.col("value").max().alias("hi"), pl.col("seed").n_unique().alias("n")).sort("step")
            n = int(per_step["n"].max())
            ax.plot(per_step["step"], per_step["mean"], marker="o", color=color,
                    label=f"{arm} pairs (mean of {n} seeds)")
            ax.fill_between(per_step["step"], per_step["lo"], per_step["hi"], color=color, alpha=0.2,
                            label=f"{arm}: range over seeds")
        ax.set_title(f"{optimizer}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(title)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return png_bytes(plt, fig)
