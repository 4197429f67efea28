"""sql/norm_vs_property.sql against scipy on the same rows (to 1e-9)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pipeline.analysis.sql import run_query
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import partial_spearman, store_synthetic, word_probe_set


@pytest.fixture
def synthetic_store(tmp_path):
    rng = np.random.default_rng(7)
    n = 240
    zipf = np.round(rng.uniform(1, 7, n), 1)  # rounded: ties exercise average ranks
    depth = rng.integers(2, 14, n).astype(float)  # many ties
    norms = 1.0 + 0.1 * zipf - 0.03 * depth + rng.normal(0, 0.05, n)
    norms[:5] = norms[5]  # tied norms too
    n_tokens = 2 + (depth > 8) + rng.integers(0, 3, n)  # token counts that partly track depth
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("synth", n, {"zipf": zipf, "min_depth": depth})
    store_synthetic(store, "m", "r1", ps, norms, shard_size=64, n_tokens=n_tokens)
    # a second release with other norms must not leak into r1's statistics
    store_synthetic(store, "m", "r2", ps, norms[::-1].copy(), shard_size=64)
    return store, norms, zipf, depth, n_tokens


def test_spearman_and_partial_match_scipy(synthetic_store):
    store, norms, zipf, depth, _ = synthetic_store
    res = run_query(open_catalog(store), "norm_vs_property", model="m", release="r1")
    got = {(r["property"], r["statistic"]): (r["value"], r["n"]) for r in res.iter_rows(named=True)}
    expected_depth = stats.spearmanr(norms, depth).statistic
    assert got[("min_depth", "spearman")][0] == pytest.approx(expected_depth, abs=1e-9)
    assert got[("zipf", "spearman")][0] == pytest.approx(stats.spearmanr(norms, zipf).statistic, abs=1e-9)
    expected_partial = partial_spearman(norms, depth, zipf)
    assert got[("min_depth", "partial_spearman_zipf")][0] == pytest.approx(expected_partial, abs=1e-9)
    assert got[("min_depth", "spearman")][1] == len(norms)
    # frequency partialled out of itself is meaningless: not reported
    assert ("zipf", "partial_spearman_zipf") not in got
    # the partial differs from the raw correlation here (zipf drives the norm), so the control matters
    assert abs(expected_partial - got[("min_depth", "spearman")][0]) > 0.05


def test_pearson_log_norm_and_token_partial_match_scipy(synthetic_store):
    store, norms, zipf, depth, n_tokens = synthetic_store
    res = run_query(open_catalog(store), "norm_vs_property", model="m", release="r1")
    got = {(r["property"], r["statistic"]): r["value"] for r in res.iter_rows(named=True)}
    for prop, values in (("min_depth", depth), ("zipf", zipf)):
        assert got[(prop, "pearson_log_norm")] == pytest.approx(
            stats.pearsonr(np.log(norms), values).statistic, abs=1e-9)
        assert got[(prop, "partial_spearman_n_tokens")] == pytest.approx(
            partial_spearman(norms, values, n_tokens), abs=1e-9)
    assert abs(got[("min_depth", "partial_spearman_n_tokens")] - got[("min_depth", "spearman")]) > 1e-3


def test_release_scoping(synthetic_store):
    store, norms, _, depth, _ = synthetic_store
    res = run_query(open_catalog(store), "norm_vs_property", model="m", release="r2")
    row = res.filter((res["property"] == "min_depth") & (res["statistic"] == "spearman")).row(0, named=True)
    assert row["value"] == pytest.approx(stats.spearmanr(norms[::-1], depth).statistic, abs=1e-9)
    # r2 stores a constant token count: partialling it out is undefined, so it is not reported
    assert "partial_spearman_n_tokens" not in res["statistic"].to_list()


@pytest.mark.parametrize("kind", ["many values", "few values"])
def test_items_without_zipf_are_left_out_of_the_frequency_control(tmp_path, kind):
    """The items that also have a zipf are a sample of their own: the property is ranked again over them
    (by sorting or by counting), not with the ranks staged over all its items."""
    rng = np.random.default_rng(3)
    n = 120
    zipf = rng.uniform(1, 7, n)
    rating = rng.normal(size=n) if kind == "many values" else rng.integers(0, 6, n).astype(float)
    norms = 1 + 0.1 * zipf + 0.05 * rating + rng.normal(0, 0.05, n)
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("partial", n, {"rating_sd": rating})
    # zipf for the first 90 items only
    ps.properties = ps.properties.vstack(word_probe_set("partial", 90, {"zipf": zipf[:90]}).properties)
    store_synthetic(store, "m", "r", ps, norms)
    res = run_query(open_catalog(store), "norm_vs_property", model="m", release="r")
    got = {(r["property"], r["statistic"]): (r["value"], r["n"]) for r in res.iter_rows(named=True)}
    expected = stats.spearmanr(norms, rating).statistic
    assert got[("rating_sd", "spearman")] == pytest.approx((expected, n), abs=1e-9)
    expected = partial_spearman(norms[:90], rating[:90], zipf[:90])
    assert got[("rating_sd", "partial_spearman_zipf")] == pytest.approx((expected, 90), abs=1e-9)
    # a property of part of the probe set is ranked over its own items, not the probe set's
    expected = stats.spearmanr(norms[:90], zipf[:90]).statistic
    assert got[("zipf", "spearman")] == pytest.approx((expected, 90), abs=1e-9)

def test_staged_ranks_match_scipy(synthetic_store):
    """The ranks stg_analysis_values stages for every analysis, by counting (min_depth: few values) and
    by sorting (zipf: many), against scipy's average and dense ranks. It is staged in steps (the release's rows,
    positions, norm ranks, then the values), whose tables are gone once it is."""
    from pipeline.analysis.sql import STAGED_STEPS, ensure_staged

    store, norms, zipf, depth, _ = synthetic_store
    con = open_catalog(store)
    for table in ("stg_analysis_groups", "stg_analysis_values"):
        ensure_staged(con, table, "m", "r1")
    tables = {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}
    assert {"stg_analysis_groups", "stg_analysis_values"} <= tables
    assert STAGED_STEPS["stg_analysis_values"] and not tables & set(STAGED_STEPS["stg_analysis_values"])
    staged = con.sql(
        "select g.property, v.* from stg_analysis_values as v join stg_analysis_groups as g using (group_key) "
        "order by g.property, v.pos"
    ).pl()
    for prop, values in (("min_depth", depth), ("zipf", zipf)):
        rows = staged.filter(staged["property"] == prop)
        assert rows["pos"].to_list() == list(range(len(values)))  # items in item_id order, as stored
        r_value = rows["value_start"].to_numpy() + (rows["value_count"].to_numpy() + 1) / 2
        np.testing.assert_allclose(r_value, stats.rankdata(values), atol=1e-12)
        np.testing.assert_array_equal(rows["d_value"].to_numpy(), stats.rankdata(values, method="dense") - 1)
        np.testing.assert_allclose(rows["r_norm"].to_numpy(), stats.rankdata(norms), atol=1e-12)
        np.testing.assert_array_equal(rows["d_norm"].to_numpy(), stats.rankdata(norms, method="dense") - 1)
        # the six tied norms, and no other item, are marked as tied
        _, first, counts = np.unique(norms, return_inverse=True, return_counts=True)
        np.testing.assert_array_equal(rows["norm_tied"].to_numpy(), counts[first] > 1)
        assert rows["norm_tied"].sum() == 6

