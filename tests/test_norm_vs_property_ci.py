"""sql/norm_vs_property_ci.sql against a numpy/scipy Poisson bootstrap drawn with the same weights (to 1e-9).

pipeline/analysis/bootstrap.py's docstring defines the weights (a seeded integer hash of replicate and item
position, mapped to Poisson(1) counts). This test re-derives them with numpy from that definition and scipy's
Poisson CDF, resamples with ``numpy.repeat``, recomputes each statistic with scipy, and takes ``numpy.quantile``:
a second implementation of the whole method, sharing only the random numbers. Separately it checks that
those random numbers behave like Poisson(1) draws, and that the intervals are of a sensible width.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from pipeline.analysis.sql import run_query
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import partial_spearman, poisson_weights, store_synthetic, word_probe_set


def bootstrap_ci(weights, norms, values, zipf, n_tokens):
    """Per statistic: (2.5%, 97.5%) quantiles of the replicate statistics, and how many were defined."""
    reps = {
        "spearman": [],
        "pearson_log_norm": [],
        "partial_spearman_zipf": [],
        "partial_spearman_n_tokens": [],
    }
    for w in weights:
        idx = np.repeat(np.arange(len(norms)), w)
        x, y, z, t = norms[idx], values[idx], zipf[idx], n_tokens[idx]
        reps["spearman"].append(stats.spearmanr(x, y).statistic)
        reps["pearson_log_norm"].append(stats.pearsonr(np.log(x), y).statistic)
        reps["partial_spearman_zipf"].append(partial_spearman(x, y, z))
        reps["partial_spearman_n_tokens"].append(partial_spearman(x, y, t))
    out = {}
    for k, v in reps.items():
        v = np.asarray(v)
        v = v[np.isfinite(v)]
        out[k] = (*np.quantile(v, [0.025, 0.975]), len(v))
    return out


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    rng = np.random.default_rng(11)
    n = 150
    zipf = np.round(rng.uniform(1, 7, n), 1)  # ~60 values: ranked row by row
    depth = rng.integers(2, 14, n).astype(float)  # 12 values: ranked by grouping equal values
    n_tokens = 2 + rng.integers(0, 3, n) + (depth > 9)
    norms = 1.0 + 0.08 * zipf - 0.03 * depth + rng.normal(0, 0.06, n)
    store = Store(str(tmp_path_factory.mktemp("ci") / "root"))
    ps = word_probe_set("synth", n, {"zipf": zipf, "min_depth": depth})
    store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
    return store, norms, zipf, depth, n_tokens


def _ci(store, **params):
    res = run_query(open_catalog(store), "norm_vs_property_ci", model="m", release="r1", **params)
    return {(r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}


def test_poisson_weights_behave_like_poisson_draws():
    w = poisson_weights(seed=5, resamples=400, n=500)
    counts = np.bincount(w.ravel(), minlength=6)[:6] / w.size
    expected = stats.poisson.pmf(np.arange(6), 1.0)
    assert np.abs(counts - expected).max() < 0.005
    # no visible dependence between neighbouring items or replicates
    assert abs(np.corrcoef(w[:, :-1].ravel(), w[:, 1:].ravel())[0, 1]) < 0.01
    assert abs(np.corrcoef(w[:-1].ravel(), w[1:].ravel())[0, 1]) < 0.01


def test_intervals_equal_numpy_bootstrap_with_the_same_weights(stored):
    store, norms, zipf, depth, n_tokens = stored
    resamples, seed = 1000, 424242
    got = _ci(store, resamples=resamples, seed=seed)
    weights = poisson_weights(seed, resamples, len(norms))  # items are stored in item_id order
    for prop, values in (("min_depth", depth), ("zipf", zipf)):
        expected = bootstrap_ci(weights, norms, values, zipf, n_tokens)
        for statistic, (low, high, n_defined) in expected.items():
            if prop == "zipf" and statistic == "partial_spearman_zipf":
                assert (prop, statistic) not in got
                continue
            row = got[(prop, statistic)]
            assert row["ci_low"] == pytest.approx(low, abs=1e-9), (prop, statistic)
            assert row["ci_high"] == pytest.approx(high, abs=1e-9), (prop, statistic)
            assert row["n_resamples"] == n_defined == resamples


def test_batches_of_replicates_give_the_numpy_bootstrap(stored):
    """Replicates staged a few at a time (a small bootstrap_batch_rows) give the same intervals as numpy,
    and every replicate exactly once."""
    store, norms, zipf, depth, n_tokens = stored
    resamples, seed = 61, 31337
    con = open_catalog(store)
    value_rows = 2 * len(norms)  # two properties, every item has both
    res = run_query(con, "norm_vs_property_ci", model="m", release="r1", resamples=resamples, seed=seed,
                    bootstrap_batch_rows=7 * value_rows)  # batches of 7 replicates, the last of 5
    got = {(r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}
    weights = poisson_weights(seed, resamples, len(norms))
    for prop, values in (("min_depth", depth), ("zipf", zipf)):
        for statistic, (low, high, n_defined) in bootstrap_ci(weights, norms, values, zipf, n_tokens).items():
            if (prop, statistic) == ("zipf", "partial_spearman_zipf"):
                continue
            row = got[(prop, statistic)]
            assert row["ci_low"] == pytest.approx(low, abs=1e-9), (prop, statistic)
            assert row["ci_high"] == pytest.approx(high, abs=1e-9), (prop, statistic)
            assert row["n_resamples"] == n_defined == resamples
    per_statistic = con.execute(
        "select property, statistic, count(*), count(distinct b), min(b), max(b) "
        "from stg_bootstrap_replicates group by all"
    ).fetchall()
    assert len(per_statistic) == len(got)
    assert all(row[2:] == (resamples, resamples, 0, resamples - 1) for row in per_statistic)


def test_replicates_are_restaged_for_another_seed_or_count(stored):
    store, *_ = stored
    con = open_catalog(store)

    def spearman_ci(**params):
        res = run_query(con, "norm_vs_property_ci", model="m", release="r1", **params)
        row = res.filter((pl.col("property") == "min_depth") & (pl.col("statistic") == "spearman")).row(0, named=True)
        return row["ci_low"], row["ci_high"], row["n_resamples"]

    first = spearman_ci(resamples=200, seed=1)
    assert spearman_ci(resamples=200, seed=2) != first
    assert spearman_ci(resamples=100, seed=1)[2] == 100
    assert spearman_ci(resamples=200, seed=1) == pytest.approx(first, abs=1e-12)


@pytest.mark.parametrize("params, name", [
    ({"resamples": 0}, "resamples"),
    ({"resamples": 2.5}, "resamples"),
    ({"resamples": 100, "bootstrap_batch_rows": 0}, "bootstrap_batch_rows"),
])
def test_a_bootstrap_size_that_is_not_a_positive_whole_number_is_refused(stored, params, name):
    store, *_ = stored
    with pytest.raises(ValueError, match=rf"{name}=.*whole number of at least 1"):
        run_query(open_catalog(store), "norm_vs_property_ci", model="m", release="r1", seed=1, **params)


def test_intervals_are_seeded_and_sensible(stored):
    store, norms, zipf, depth, _ = stored
    a = _ci(store, resamples=1000, seed=1)
    again = _ci(store, resamples=1000, seed=1)
    assert again.keys() == a.keys()
    for key, row in a.items():  # same seed, same intervals (up to the order of parallel float sums)
        assert again[key]["ci_low"] == pytest.approx(row["ci_low"], abs=1e-12)
        assert again[key]["ci_high"] == pytest.approx(row["ci_high"], abs=1e-12)
    b = _ci(store, resamples=1000, seed=2)
    assert a[("min_depth", "spearman")]["ci_low"] != b[("min_depth", "spearman")]["ci_low"]
    point = stats.spearmanr(norms, depth).statistic
    row = a[("min_depth", "spearman")]
    assert row["ci_low"] < point < row["ci_high"]
    # the bootstrap width is close to the large-sample width of Spearman's rho (Bonett & Wright 2000)
    se = np.sqrt((1 + point**2 / 2) / (len(norms) - 3)) * (1 - point**2)
    assert 0.6 < (row["ci_high"] - row["ci_low"]) / (2 * 1.96 * se) < 1.6


@pytest.mark.parametrize("kind", ["many values", "few values"])
def test_partial_intervals_use_only_items_with_a_zipf(tmp_path, kind):
    """The items that also have a zipf are a sample of their own: its property is centred and ranked over
    them alone, by sorting (many values) or summed per value (few)."""
    rng = np.random.default_rng(2)
    n = 80
    zipf = rng.uniform(1, 7, n)
    rating = rng.normal(size=n) if kind == "many values" else rng.integers(0, 5, n).astype(float)
    norms = 1 + 0.1 * zipf + 0.1 * rating + rng.normal(0, 0.05, n)
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("p", n, {"rating_sd": rating})
    ps.properties = ps.properties.vstack(word_probe_set("p", 60, {"zipf": zipf[:60]}).properties)
    store_synthetic(store, "m", "r1", ps, norms)
    got = _ci(store, resamples=1000, seed=9)
    w = poisson_weights(9, 1000, n)
    # the rank universe of the frequency control is the 60 items with a zipf; positions stay those of all 80
    expected = bootstrap_ci(w[:, :60], norms[:60], rating[:60], zipf[:60], np.full(60, 3))
    low, high, _ = expected["partial_spearman_zipf"]
    assert got[("rating_sd", "partial_spearman_zipf")]["ci_low"] == pytest.approx(low, abs=1e-9)
    assert got[("rating_sd", "partial_spearman_zipf")]["ci_high"] == pytest.approx(high, abs=1e-9)
    expected = bootstrap_ci(w, norms, rating, np.zeros(n), np.full(n, 3))
    for statistic in ("spearman", "pearson_log_norm"):
        low, high, _ = expected[statistic]
        assert got[("rating_sd", statistic)]["ci_low"] == pytest.approx(low, abs=1e-9)
        assert got[("rating_sd", statistic)]["ci_high"] == pytest.approx(high, abs=1e-9)


def test_intervals_per_probe_set_with_tied_norms_and_values(tmp_path):
    """Two probe sets in one release: each replicate's sort runs across item sets and replicates, so
    every (item set, replicate) must be ranked on its own; tied norms and tied many-valued scores share
    their average weighted rank."""
    resamples, seed = 300, 77
    store = Store(str(tmp_path / "root"))
    expected = {}
    for name, n, data_seed in (("a", 90, 3), ("b", 70, 4)):
        rng = np.random.default_rng(data_seed)
        zipf = np.round(rng.uniform(1, 7, n), 1)
        depth = rng.integers(0, 6, n).astype(float)  # few values: summed per value
        score = np.round(rng.normal(size=n), 1)  # many values, with ties: sorted
        n_tokens = 1 + rng.integers(0, 3, n)
        norms = 1.0 + 0.05 * zipf + 0.02 * depth + 0.03 * score + rng.normal(0, 0.05, n)
        norms[:6] = norms[6]  # a tie group of norms
        ps = word_probe_set(name, n, {"zipf": zipf, "min_depth": depth, "score": score})
        store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
        weights = poisson_weights(seed, resamples, n)
        for prop, values in (("min_depth", depth), ("score", score)):
            expected[(name, prop)] = bootstrap_ci(weights, norms, values, zipf, n_tokens)
    res = run_query(open_catalog(store), "norm_vs_property_ci", model="m", release="r1",
                    resamples=resamples, seed=seed)
    got = {(r["probe_set"], r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}
    for (name, prop), stats_expected in expected.items():
        for statistic, (low, high, n_defined) in stats_expected.items():
            row = got[(name, prop, statistic)]
            assert row["ci_low"] == pytest.approx(low, abs=1e-9), (name, prop, statistic)
            assert row["ci_high"] == pytest.approx(high, abs=1e-9), (name, prop, statistic)
            assert row["n_resamples"] == n_defined


# the reference also computes zipf's partial correlation given zipf (undefined, and not compared)
@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
def test_intervals_when_zipf_itself_has_few_values(tmp_path):
    """zipf itself with few distinct values (summed per value, where the tests above sort it): over a whole
    probe set, and over a probe set where one item lacks it, beside a few- and a many-valued property."""
    resamples, seed, n = 200, 5, 200
    rng = np.random.default_rng(21)
    zipf = np.round(rng.uniform(1, 7, n) * 2) / 2  # 13 values: few
    depth = rng.integers(0, 6, n).astype(float)  # few values
    score = rng.normal(size=n)  # many values
    n_tokens = 1 + rng.integers(0, 3, n)
    norms = 1.0 + 0.05 * zipf + 0.02 * depth + 0.03 * score + rng.normal(0, 0.05, n)
    store = Store(str(tmp_path / "root"))
    weights = poisson_weights(seed, resamples, n)
    for name in ("all", "one_missing"):
        ps = word_probe_set(name, n, {"zipf": zipf, "min_depth": depth, "score": score})
        if name == "one_missing":
            ps.properties = ps.properties.filter(
                ~((pl.col("item_id") == "w00017") & (pl.col("property") == "zipf"))
            )
        store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
    res = run_query(open_catalog(store), "norm_vs_property_ci", model="m", release="r1",
                    resamples=resamples, seed=seed)
    got = {(r["probe_set"], r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}
    # zipf's own intervals: over all items, and over the items with a zipf (the item at position 17 left out)
    for name, keep in (("all", np.ones(n, bool)), ("one_missing", np.arange(n) != 17)):
        expected = bootstrap_ci(weights[:, keep], norms[keep], zipf[keep], zipf[keep], n_tokens[keep])
        for statistic in ("spearman", "pearson_log_norm", "partial_spearman_n_tokens"):
            low, high, n_defined = expected[statistic]
            row = got[(name, "zipf", statistic)]
            assert row["ci_low"] == pytest.approx(low, abs=1e-9), (name, statistic)
            assert row["ci_high"] == pytest.approx(high, abs=1e-9), (name, statistic)
            assert row["n_resamples"] == n_defined
        assert (name, "zipf", "partial_spearman_zipf") not in got
    # the other properties of the full set, beside it
    for prop, values in (("min_depth", depth), ("score", score)):
        expected = bootstrap_ci(weights, norms, values, zipf, n_tokens)
        for statistic, (low, high, _) in expected.items():
            row = got[("all", prop, statistic)]
            assert row["ci_low"] == pytest.approx(low, abs=1e-9), (prop, statistic)
            assert row["ci_high"] == pytest.approx(high, abs=1e-9), (prop, statistic)
