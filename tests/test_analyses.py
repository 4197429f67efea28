"""norm_by_bin, hypernym_pairs and token_norm_vs_frequency against numpy/scipy on the same stored rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from pipeline.analysis.analyses import interval_note, run_analysis
from pipeline.analysis.sql import run_query
from pipeline.probes import ProbeSet
from pipeline.storage.catalog import open_catalog
from pipeline.storage.runs import write_results
from pipeline.storage.store import Store
from tests.helpers import store_synthetic, word_probe_set


@pytest.fixture
def word_store(tmp_path):
    rng = np.random.default_rng(5)
    n = 203  # not a multiple of 10: unequal deciles
    zipf = np.round(rng.uniform(1, 7, n), 2)
    zipf[10:14] = zipf[3]  # ties across a decile boundary are split by item_id
    depth = rng.integers(2, 9, n).astype(float)  # 7 values: one bin per value
    norms = 1 + 0.05 * zipf + rng.normal(0, 0.05, n)
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("words", n, {"zipf": zipf, "min_depth": depth})
    store_synthetic(store, "m", "r1", ps, norms)
    return store, norms, zipf, depth


def _bins(res, prop):
    rows = res.filter(pl.col("property") == prop)
    return {r["statistic"]: (r["value"], r["n"]) for r in rows.iter_rows(named=True)}


def test_norm_by_bin_deciles_match_numpy(word_store):
    store, norms, zipf, _ = word_store
    got = _bins(run_query(open_catalog(store), "norm_by_bin", model="m", release="r1", n_bins=10), "zipf")
    ids = np.array([f"w{i:05d}" for i in range(len(norms))])
    order = np.lexsort((ids, zipf))  # by value, then item_id
    for b, members in enumerate(np.array_split(order, 10), start=1):
        x = norms[members]
        q1, med, q3 = np.percentile(x, [25, 50, 75])
        assert got[f"bin{b:02d}_mean"] == pytest.approx((x.mean(), len(x)), abs=1e-9)
        assert got[f"bin{b:02d}_median"][0] == pytest.approx(med, abs=1e-9)
        assert got[f"bin{b:02d}_iqr"][0] == pytest.approx(q3 - q1, abs=1e-9)
        assert got[f"bin{b:02d}_q1"][0] == pytest.approx(q1, abs=1e-9)
        assert got[f"bin{b:02d}_low"][0] == zipf[members].min()
        assert got[f"bin{b:02d}_high"][0] == zipf[members].max()
    assert "bin11_mean" not in got


def test_norm_by_bin_deciles_of_a_tied_property_match_numpy(tmp_path):
    """40 values over 1,003 items: bins are found by counting values, and the values whose items straddle a
    decile boundary are split in item_id order, as when the rows are sorted."""
    rng = np.random.default_rng(11)
    n = 1003
    level = rng.integers(0, 40, n).astype(float)
    norms = 1 + 0.01 * level + rng.normal(0, 0.05, n)
    store = Store(str(tmp_path / "root"))
    store_synthetic(store, "m", "r1", word_probe_set("words", n, {"level": level}), norms)
    got = _bins(run_query(open_catalog(store), "norm_by_bin", model="m", release="r1", n_bins=10), "level")
    ids = np.array([f"w{i:05d}" for i in range(n)])
    order = np.lexsort((ids, level))
    for b, members in enumerate(np.array_split(order, 10), start=1):
        x = norms[members]
        assert got[f"bin{b:02d}_mean"] == pytest.approx((x.mean(), len(x)), abs=1e-9)
        assert got[f"bin{b:02d}_median"][0] == pytest.approx(np.median(x), abs=1e-9)
        assert got[f"bin{b:02d}_low"][0] == level[members].min()
    edges = np.cumsum([len(m) for m in np.array_split(order, 10)])[:-1]
    assert any(level[order[e - 1]] == level[order[e]] for e in edges)  # some value straddles a boundary


def test_norm_by_bin_one_bin_per_value_when_few(word_store):
    store, norms, _, depth = word_store
    got = _bins(
        run_query(open_catalog(store), "norm_by_bin", model="m", release="r1", n_bins=10), "min_depth"
    )
    for b, value in enumerate(np.unique(depth), start=1):
        x = norms[depth == value]
        assert got[f"bin{b:02d}_low"][0] == got[f"bin{b:02d}_high"][0] == value
        assert got[f"bin{b:02d}_mean"] == pytest.approx((x.mean(), len(x)), abs=1e-9)
        assert got[f"bin{b:02d}_median"][0] == pytest.approx(np.median(x), abs=1e-9)


def _pairs_store(tmp_path, n_pairs=300, seed=8):
    """Words w0..: pair i is (hypernym w(2i), hyponym w(2i+1)); the hyponym is usually rarer and larger."""
    rng = np.random.default_rng(seed)
    n = 2 * n_pairs
    zipf = rng.uniform(2, 6, n)
    zipf[1::2] = zipf[0::2] + rng.normal(-0.3, 0.4, n_pairs)
    norms = 1 - 0.05 * zipf + rng.normal(0, 0.03, n)
    ps = word_probe_set("pairs", n, {"zipf": zipf})
    ids = ps.items["item_id"].to_list()
    relations = pl.DataFrame(
        {"left_id": ids[0::2], "right_id": ids[1::2], "relation": "hypernym_of", "value": 1.0}
    )
    ps = ProbeSet(name="pairs", items=ps.items, properties=ps.properties, relations=relations)
    store = Store(str(tmp_path / "root"))
    store_synthetic(store, "m", "r1", ps, norms)
    return store, norms, zipf


def test_hypernym_pairs_share_and_wilson_interval(tmp_path):
    store, norms, zipf = _pairs_store(tmp_path)
    res = run_query(open_catalog(store), "hypernym_pairs", model="m", release="r1", zipf_tolerance=0.25)
    got = {r["statistic"]: r for r in res.iter_rows(named=True)}
    greater = norms[1::2] > norms[0::2]
    matched = np.abs(zipf[1::2] - zipf[0::2]) <= 0.25
    for statistic, mask in (
        ("share_hyponym_norm_greater", np.ones_like(matched)),
        ("share_hyponym_norm_greater_zipf_matched", matched),
    ):
        k, n = int(greater[mask].sum()), int(mask.sum())
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        row = got[statistic]
        assert row["n"] == n and row["property"] == "hypernym_of"
        assert row["value"] == pytest.approx(k / n, abs=1e-9)
        assert row["ci_low"] == pytest.approx(ci.low, abs=1e-9)
        assert row["ci_high"] == pytest.approx(ci.high, abs=1e-9)
    # matching on frequency changes the answer here: raw pairs mix the frequency effect in
    assert (
        got["share_hyponym_norm_greater"]["value"] != got["share_hyponym_norm_greater_zipf_matched"]["value"]
    )


def test_token_norm_vs_frequency_matches_scipy(tmp_path):
    rng = np.random.default_rng(4)
    words = [f"word{i}" for i in range(150)]
    zipf = rng.uniform(1, 7, len(words))
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("words", len(words), {"zipf": zipf})
    ps.items = ps.items.with_columns(
        pl.Series("text", [w.capitalize() for w in words])
    )  # matched ignoring case
    store_synthetic(store, "m", "r1", ps, np.ones(len(words)))
    # a WordPiece vocabulary: whole words, continuation pieces (never matched) and specials
    tokens = words[:120] + ["##" + w for w in words[120:]] + ["[CLS]", "unrelated"]
    token_norms = 2 - 0.1 * np.concatenate([zipf[:120], rng.uniform(1, 7, 32)]) + rng.normal(0, 0.1, 152)
    store.write_table(
        f"{store.token_norms_dir('m', 'r1')}/part-0.parquet",
        pl.DataFrame(
            {
                "model": "m",
                "release": "r1",
                "token_id": np.arange(152),
                "token": tokens,
                "norm": token_norms,
            }
        ).to_arrow(),
    )
    res = run_query(open_catalog(store), "token_norm_vs_frequency", model="m", release="r1")
    got = {r["statistic"]: r for r in res.iter_rows(named=True)}
    x, z = token_norms[:120], zipf[:120]
    assert got["spearman"]["n"] == 120 and got["spearman"]["probe_set"] == "words"
    assert got["spearman"]["value"] == pytest.approx(stats.spearmanr(x, z).statistic, abs=1e-9)
    assert got["pearson_log_norm"]["value"] == pytest.approx(stats.pearsonr(np.log(x), z).statistic, abs=1e-9)


def test_token_matching_for_sentencepiece_vocabularies(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("words", 4, {"zipf": np.array([5.0, 4.0, 3.0, 2.0])})
    ps.items = ps.items.with_columns(pl.Series("text", ["the", "cat", "sat", "mat"]))
    store_synthetic(store, "m", "r1", ps, np.ones(4))
    store.write_table(
        f"{store.token_norms_dir('m', 'r1')}/part-0.parquet",
        pl.DataFrame(
            {
                "model": "m",
                "release": "r1",
                "token_id": np.arange(6),
                "token": ["▁the", "▁cat", "▁sat", "▁mat", "cat", "the"],  # unmarked pieces are word-internal
                "norm": [1.0, 2.0, 3.0, 4.0, 9.0, 9.0],
            }
        ).to_arrow(),
    )
    res = run_query(open_catalog(store), "token_norm_vs_frequency", model="m", release="r1")
    row = res.filter(pl.col("statistic") == "spearman").row(0, named=True)
    assert (row["n"], row["value"]) == (4, pytest.approx(-1.0))


def test_analyses_without_their_inputs_produce_no_rows(word_store):
    store, *_ = word_store
    con = open_catalog(store)
    for name in ("hypernym_pairs", "token_norm_vs_frequency", "retrieval_calibration", "norm_rescoring"):
        res = run_analysis(con, name, "m", "r1", "run-1")
        assert res.height == 0, name
    res = run_analysis(con, "norm_vs_property", "m", "r1", "run-1", resamples=200)
    assert res.height > 0 and res["ci_low"].is_not_null().all() and (res["ci_low"] <= res["ci_high"]).all()
    assert set(res["run_id"]) == {"run-1"} and set(res["analysis"]) == {"norm_vs_property"}


@pytest.mark.parametrize("setting", [True, False])
def test_queries_leave_the_connections_row_order_setting_as_it_was(word_store, setting):
    """Staging lets DuckDB write rows in any order, and restores the connection's setting after."""
    store, *_ = word_store
    con = open_catalog(store)
    con.execute(f"set preserve_insertion_order = {setting}")
    first = run_query(con, "norm_by_bin", model="m", release="r1", n_bins=10)
    assert con.execute("select current_setting('preserve_insertion_order')").fetchone()[0] is setting
    again = run_query(open_catalog(store), "norm_by_bin", model="m", release="r1", n_bins=10)
    assert first.equals(again)


def test_results_name_the_method_of_each_interval_and_older_files_read_as_null(word_store):
    """norm_vs_property's rows carry n_resamples and ci_method (the m-out-of-n bootstrap above the switch-over,
    the Poisson bootstrap below it), the summary line names the switch-over, and results stored before the two
    columns existed read them as null beside newer ones."""
    store, *_ = word_store
    con = open_catalog(store)
    params = {"resamples": 50, "bootstrap_switch_n": 150, "bootstrap_m": 100}  # the set has 203 items
    large = run_analysis(con, "norm_vs_property", "m", "r1", "run-a", **params)
    assert large.height and set(large["ci_method"]) == {"m-out-of-n bootstrap m=100"}
    assert set(large["n_resamples"]) == {50} and large["ci_low"].is_not_null().all()
    small = run_analysis(con, "norm_vs_property", "m", "r1", "run-b", resamples=50)
    assert set(small["ci_method"]) == {"poisson bootstrap"} and set(small["n_resamples"]) == {50}
    assert interval_note(large, params) == (
        "intervals: m-out-of-n bootstrap (m=100, rescaled by sqrt(m/n)) above n=150 items: "
        f"{large.height} of {large.height} rows; poisson bootstrap, 50 resamples, below")
    assert interval_note(small) == ("intervals: poisson bootstrap, 1000 resamples; m-out-of-n bootstrap "
                                    "(m=65536, rescaled by sqrt(m/n)) above n=250000 items: none here")
    bins = run_analysis(con, "norm_by_bin", "m", "r1", "run-a")
    assert bins["ci_method"].is_null().all() and bins["n_resamples"].is_null().all()

    old = large.drop("n_resamples", "ci_method").with_columns(pl.lit("run-old").alias("run_id"))
    write_results(store, "run-old", "norm_vs_property", old)
    only_old = open_catalog(store).execute(
        "select count(*), count(ci_method), count(n_resamples) from results").fetchone()
    assert only_old == (large.height, 0, 0)
    write_results(store, "run-a", "norm_vs_property", large)
    both = open_catalog(store).execute("select run_id, count(*), count(ci_method), min(ci_method), "
                                       "count(n_resamples) from results group by run_id order by run_id").fetchall()
    k = large.height
    assert both == [("run-a", k, k, "m-out-of-n bootstrap m=100", k), ("run-old", k, 0, None, 0)]
