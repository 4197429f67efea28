"""The report's plots read DuckDB's summaries, not every item: the numbers they draw equal numpy's and matplotlib's
on the items themselves."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from matplotlib import cbook

from pipeline.analysis.report_plots import DENSITY_CELLS, property_plots
from pipeline.analysis.sql import run_query
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import store_synthetic, word_probe_set

N = 3000


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    rng = np.random.default_rng(36)
    depth = rng.integers(0, 7, N).astype(float)
    zipf = rng.uniform(1, 7, N)
    norms = 1 + 0.1 * depth + 0.05 * zipf + rng.normal(0, 0.2, N)
    norms[depth == 6] = 2.5  # a level whose norms are all equal: no box, whiskers at the median
    norms[:5] = [9.0, 0.1, 8.0, 0.2, 7.5]  # outliers beyond 1.5 IQR
    store = Store(str(tmp_path_factory.mktemp("plots") / "root"))
    store_synthetic(store, "m", "r", word_probe_set("p", N, {"min_depth": depth, "zipf": zipf}), norms,
                    shard_size=1000)
    return store, depth, zipf, norms.astype(np.float32).astype(float)


def test_box_stats_equal_matplotlibs_on_every_item(stored):
    store, depth, _, norms = stored
    got = run_query(open_catalog(store), "report_box_stats", model="m", release="r", property="min_depth")
    assert got["level"].to_list() == sorted(set(depth))
    for row in got.iter_rows(named=True):
        norms_at = norms[depth == row["level"]]
        (expected,) = cbook.boxplot_stats(norms_at)
        assert row["n"] == len(norms_at)
        for key in ("whislo", "q1", "med", "q3", "whishi"):
            assert row[key] == pytest.approx(expected[key], abs=1e-6), (row["level"], key)


def test_density_counts_equal_numpys_two_dimensional_histogram(stored):
    store, _, zipf, norms = stored
    con = open_catalog(store)
    # every property asked for at once: those the set lacks (rating_sd) have no row; the norms' range is the
    # inventory's
    (extent,) = run_query(con, "report_extents", properties=["zipf", "rating_sd"]).rows(named=True)
    (inventory,) = run_query(con, "report_inventory", model="m", release="r").rows(named=True)
    x0, x1, y0, y1 = zipf.min(), zipf.max(), norms.min(), norms.max()
    assert extent == pytest.approx({"probe_set": "p", "property": "zipf", "x0": x0, "x1": x1})
    assert (inventory["min_norm"], inventory["max_norm"]) == pytest.approx((y0, y1))
    extent = {"x0": extent["x0"], "x1": extent["x1"], "y0": inventory["min_norm"], "y1": inventory["max_norm"]}
    got = run_query(con, "report_density", model="m", release="r", property="zipf", probe_set="p", cells=40,
                    **extent)
    assert got["items"].sum() == N
    counts, _, _ = np.histogram2d(zipf, norms, bins=40, range=[[x0, x1], [y0, y1]])
    i = np.floor((got["x"].to_numpy() - x0) / (x1 - x0) * 40).astype(int)
    j = np.floor((got["y"].to_numpy() - y0) / (y1 - y0) * 40).astype(int)
    np.testing.assert_array_equal(got["items"].to_numpy(), counts[i, j])
    assert (counts > 0).sum() == got.height  # every occupied cell, once


def test_a_set_over_the_points_limit_is_drawn_from_grid_counts(stored):
    store, *_ = stored
    con = open_catalog(store)
    results = pl.DataFrame(schema={"analysis": pl.String, "probe_set": pl.String, "property": pl.String,
                                   "statistic": pl.String, "value": pl.Float64, "ci_low": pl.Float64,
                                   "ci_high": pl.Float64})
    plots = {p.file: p.caption for p in property_plots(con, store, "plots", "m", "r", results, points_max=N - 1)}
    assert set(plots) == {"norm_vs_zipf_p.png", "norm_vs_min_depth_p.png"}
    assert f"counted on a {DENSITY_CELLS} × {DENSITY_CELLS} grid" in plots["norm_vs_zipf_p.png"]
    assert store.read_bytes("plots/norm_vs_zipf_p.png").startswith(b"\x89PNG")
    drawn = property_plots(con, store, "plots", "m", "r", results)  # within the limit: from the items
    assert all("grid" not in p.caption for p in drawn)
