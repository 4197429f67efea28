"""The imprint grid's summary (pipeline.theory.imprint): intervals over seeds against scipy's own tests, the
table's arithmetic on a hand-made grid, and the figure."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from pipeline.theory.imprint import STATISTICS, imprint_figure, seed_table, t_interval, welch_interval


def test_t_interval_equals_scipys_one_sample_t_test_interval():
    x = np.array([0.031, 0.052, 0.018, 0.047])
    mean, lo, hi = t_interval(x)
    ci = stats.ttest_1samp(x, 0).confidence_interval(0.95)
    assert mean == pytest.approx(x.mean())
    assert (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert np.isnan(t_interval(np.array([0.1]))[1])


def test_welch_interval_equals_scipys_unequal_variance_interval():
    a, b = np.array([0.08, 0.05, 0.11]), np.array([0.01, -0.02, 0.03, 0.0])
    diff, lo, hi = welch_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff == pytest.approx(a.mean() - b.mean())
    assert (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)


def _grid() -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for key, *_ in STATISTICS:
        for optimizer in ("adamw", "sgd"):
            for arm, shift in (("semantic", 0.05), ("shuffled", 0.0)):
                for seed in range(3):
                    d = shift + rng.normal(0, 0.01)
                    rows.append({"key": key, "optimizer": optimizer, "arm": arm, "seed": seed, "base_value": 0.5,
                                 "value": 0.5 + d, "difference": d, "ci_low": d - 0.02, "ci_high": d + 0.02})
    return pl.DataFrame(rows)


def test_seed_table_reports_each_arm_and_the_difference_over_seeds():
    changes = _grid()
    table = seed_table(changes)
    assert table.height == len(STATISTICS) * 2
    row = table.filter((pl.col("key") == "zipf") & (pl.col("optimizer") == "sgd")).row(0, named=True)
    sub = changes.filter((pl.col("key") == "zipf") & (pl.col("optimizer") == "sgd"))
    sem = sub.filter(pl.col("arm") == "semantic")["difference"].to_numpy()
    shuf = sub.filter(pl.col("arm") == "shuffled")["difference"].to_numpy()
    ci = stats.ttest_1samp(sem, 0).confidence_interval(0.95)
    assert (row["semantic_change"], row["semantic_low"], row["semantic_high"]) == pytest.approx(
        (sem.mean(), ci.low, ci.high))
    welch = stats.ttest_ind(sem, shuf, equal_var=False).confidence_interval(0.95)
    assert (row["sms_low"], row["sms_high"]) == pytest.approx((welch.low, welch.high))
    assert row["semantic_seeds"] == 3 and row["step0"] == 0.5
    # a seed's paired interval (d +- 0.02) excludes 0 when |d| > 0.02: count them independently
    assert row["semantic_seeds_differ"] == int((np.abs(sem) > 0.02).sum())
    assert row["shuffled_seeds_differ"] == int((np.abs(shuf) > 0.02).sum())


def test_imprint_figure_is_a_png_with_one_panel_per_optimizer():
    rows = [{"key": "zipf", "optimizer": o, "arm": a, "seed": s, "step": step, "value": 0.1 * step + s}
            for o in ("adamw", "sgd") for a in ("semantic", "shuffled") for s in range(3) for step in (0, 300)]
    png = imprint_figure(pl.DataFrame(rows), "zipf", "nouns · ρ(norm, zipf)")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
