"""pipeline/analysis/bootstrap.py replicate by replicate: each replicate statistic against scipy on the
``numpy.repeat``'ed resample (1e-9), its weights against the SQL hash the paired comparison uses, and its
values independent of how replicates are batched, chunked and spread over threads (exactly).

The intervals built from these replicates are tested in tests/test_norm_vs_property_ci.py.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from pipeline.analysis import bootstrap, m_out_of_n, replicates
from pipeline.analysis.paired import paired_comparison
from pipeline.analysis.sql import ANALYSIS_STAGED, BOOTSTRAP, ensure_staged, load_sql, run_query, stage_replicate_keys
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import partial_spearman, poisson_weights, store_synthetic, word_probe_set

SEED = 8675309


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Probe set "p": tied norms, a few-valued property, a many-valued one with ties, one without ties, a
    constant one, a zipf lacking for some items and a property covering part of the items."""
    rng = np.random.default_rng(19)
    n = 160
    zipf = np.round(rng.uniform(1, 7, n), 1)
    depth = rng.integers(0, 6, n).astype(float)  # 6 values: per-value sums
    score = np.round(rng.normal(size=n), 1)  # many values, tied: sorted, tie groups
    smooth = rng.normal(size=n)  # many values, no ties
    n_tokens = 1 + rng.integers(0, 4, n)
    norms = 1.0 + 0.05 * zipf + 0.02 * depth + 0.03 * score + rng.normal(0, 0.05, n)
    norms[10:15] = norms[3]  # a tie group of norms
    store = Store(str(tmp_path_factory.mktemp("bootstrap") / "root"))
    ps = word_probe_set("p", n, {"zipf": zipf, "min_depth": depth, "score": score, "smooth": smooth,
                                 "flat": np.ones(n)})
    ps.properties = ps.properties.filter(
        ~((pl.col("property") == "zipf") & pl.col("item_id").is_in(["w00002", "w00040", "w00041"]))
        & ~((pl.col("property") == "smooth") & (pl.col("item_id") >= "w00120")))
    store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
    has_zipf = np.ones(n, bool)
    has_zipf[[2, 40, 41]] = False
    return store, dict(norms=norms, zipf=zipf, depth=depth, score=score, smooth=smooth, n_tokens=n_tokens,
                       has_zipf=has_zipf)


def _replicates(store, resamples, batch_resamples, **kwargs):
    con = open_catalog(store)
    for table in ANALYSIS_STAGED:
        ensure_staged(con, table, "m", "r1")
    replicates.stage_replicates(con, BOOTSTRAP, SEED, resamples, batch_resamples, **kwargs)
    rows = con.execute(f"select property, statistic, b, value from {BOOTSTRAP} order by all").fetchall()
    return {(prop, statistic, b): value for prop, statistic, b, value in rows}


def _scipy(norms, values, n_tokens, zipf, w):
    idx = np.repeat(np.arange(len(norms)), w)
    x, y = norms[idx], values[idx]
    return {"spearman": stats.spearmanr(x, y).statistic,
            "pearson_log_norm": stats.pearsonr(np.log(x), y).statistic,
            "partial_spearman_n_tokens": partial_spearman(x, y, n_tokens[idx]),
            "partial_spearman_zipf": partial_spearman(x, y, zipf[idx]) if zipf is not None else None}


def test_each_replicate_equals_scipy_on_the_repeated_resample(stored):
    store, d = stored
    resamples = 40
    got = _replicates(store, resamples, resamples)
    n = len(d["norms"])
    weights = poisson_weights(SEED, resamples, n)
    keep = {"min_depth": np.ones(n, bool), "score": np.ones(n, bool), "smooth": np.arange(n) < 120,
            "zipf": d["has_zipf"]}
    checked = 0
    for prop, items in keep.items():
        values = d["zipf"] if prop == "zipf" else d[{"min_depth": "depth"}.get(prop, prop)]
        for b in range(resamples):
            w = weights[b]
            ref = _scipy(d["norms"][items], values[items], d["n_tokens"][items], None, w[items])
            for statistic in ("spearman", "pearson_log_norm", "partial_spearman_n_tokens"):
                assert got[(prop, statistic, b)] == pytest.approx(ref[statistic], abs=1e-9), (prop, statistic, b)
                checked += 1
            if prop != "zipf":  # the frequency control: over the items that also have a zipf
                both = items & d["has_zipf"]
                ref = _scipy(d["norms"][both], values[both], d["n_tokens"][both], d["zipf"][both], w[both])
                assert got[(prop, "partial_spearman_zipf", b)] == pytest.approx(
                    ref["partial_spearman_zipf"], abs=1e-9), (prop, b)
                checked += 1
            else:
                assert (prop, "partial_spearman_zipf", b) not in got
    assert checked == resamples * (4 * 3 + 3)
    # a constant property has no defined statistic in any replicate (NaN, dropped by the intervals)
    flat = [v for (prop, _, _), v in got.items() if prop == "flat"]
    assert flat and not np.isfinite(flat).any()


@pytest.mark.parametrize("split", [
    {"batch_resamples": 7},  # batches of 7 replicates, the last of 3
    {"batch_resamples": 31, "chunk_cells": 500},  # chunks of 3 replicates within each batch
    {"batch_resamples": 31, "chunk_cells": 1, "threads": 2},  # one replicate a chunk, on two threads
])
def test_batching_chunking_and_threads_change_no_value(stored, split):
    store, _ = stored
    whole = _replicates(store, 31, 31, threads=1)
    parts = _replicates(store, 31, **split)
    assert list(parts) == list(whole)
    # exactly (NaN where undefined in both): each replicate is computed on its own
    np.testing.assert_array_equal(list(parts.values()), list(whole.values()))
    assert {b for _, _, b in whole} == set(range(31))


def test_weights_equal_the_sql_hash_of_paired_weights(stored):
    """The paired comparison's units draw their weights in SQL (paired_weights.sql): the same numbers."""
    store, _ = stored
    con = open_catalog(store)
    first, count, n = 5, 12, 3000
    stage_replicate_keys(con, SEED, first, count)
    sql = con.execute(f"select b, pos, w from ({load_sql('paired_weights')}) order by b, pos",
                      {"n_positions": n}).fetchall()
    expected = np.zeros((count, n))
    for b, pos, w in sql:
        expected[b - first, pos] = w
    positions = np.random.default_rng(0).permutation(n)  # any order of positions: the hash is per item
    got = bootstrap.poisson_weights(bootstrap.replicate_keys(SEED, first, count), positions)
    np.testing.assert_array_equal(got, expected[:, positions])
    np.testing.assert_array_equal(got, poisson_weights(SEED, first + count, n)[first:, positions])


# ---------- the m-out-of-n bootstrap of large samples ----------

M32 = np.uint64(2**32)


def _hash(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint64 holding 32-bit values, written from the docstring's definition."""
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) % M32
    x = x ^ (x >> np.uint64(15))
    x = (x * np.uint64(0x846CA68B)) % M32
    return x ^ (x >> np.uint64(16))


def m_out_of_n_draws(seed: int, resamples: int, m: int, n: int) -> np.ndarray:
    """(resamples, m) positions in 0..n-1: draw j of replicate b is (h(key xor 2j) 2^32 + h(key xor 2j+1)) mod n."""
    keys = _hash((np.uint64(seed) * np.uint64(2654435769) + np.arange(resamples, dtype=np.uint64)) % M32)
    j = np.arange(m, dtype=np.uint64)
    out = np.empty((resamples, m), dtype=np.int64)
    for b in range(resamples):
        high, low = _hash(keys[b] ^ (2 * j)), _hash(keys[b] ^ (2 * j + np.uint64(1)))
        out[b] = ((high << np.uint64(32)) | low) % np.uint64(n)
    return out


def _statistics(norms, values, n_tokens, zipf):
    out = {"spearman": stats.spearmanr(norms, values).statistic,
           "pearson_log_norm": stats.pearsonr(np.log(norms), values).statistic,
           "partial_spearman_n_tokens": partial_spearman(norms, values, n_tokens)}
    if zipf is not None:
        out["partial_spearman_zipf"] = partial_spearman(norms, values, zipf)
    return out


def m_out_of_n_ci(draws: np.ndarray, norms, values, n_tokens, zipf=None):
    """Per statistic: (2.5%, 97.5%) quantiles of T_n + sqrt(m/n) (T*_m - T_n) over the replicates, T*_m on the
    drawn items (numpy.take, duplicates kept), and how many replicates were defined."""
    n, m = len(norms), draws.shape[1]
    full = _statistics(norms, values, n_tokens, zipf)
    reps = {k: [] for k in full}
    for idx in draws:
        drawn = _statistics(norms[idx], values[idx], n_tokens[idx], None if zipf is None else zipf[idx])
        for k, v in drawn.items():
            reps[k].append(full[k] + np.sqrt(m / n) * (v - full[k]))
    out = {}
    for k, v in reps.items():
        v = np.asarray(v)[np.isfinite(v)]
        out[k] = (*np.quantile(v, [0.025, 0.975]), len(v))
    return out


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """Probe set "big" (2,400 items) above a switch-over of 1,000 and "small" (300) below it: few-valued,
    many-valued (with and without ties) and partial properties, tied norms, items lacking a zipf."""
    rng = np.random.default_rng(26)
    n = 2400
    zipf = np.round(rng.uniform(1, 7, n), 1)
    depth = rng.integers(0, 6, n).astype(float)  # few values: counted per value
    score = np.round(rng.normal(size=n), 2)  # ~500 values over 2,400 items, more than m: sorted, with ties
    smooth = rng.normal(size=n)  # no ties
    n_tokens = 1 + rng.integers(0, 4, n)
    norms = 1.0 + 0.05 * zipf + 0.02 * depth + 0.03 * score + 0.02 * smooth + rng.normal(0, 0.05, n)
    norms[100:108] = norms[7]  # a tie group of norms
    store = Store(str(tmp_path_factory.mktemp("large") / "root"))
    ps = word_probe_set("big", n, {"zipf": zipf, "min_depth": depth, "score": score, "smooth": smooth})
    ps.properties = ps.properties.filter(
        ~((pl.col("property") == "zipf") & pl.col("item_id").is_in(["w00002", "w00040", "w01500"]))
        & ~((pl.col("property") == "smooth") & (pl.col("item_id") >= "w01800")))
    store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens, shard_size=1200)
    small = word_probe_set("small", 300, {"zipf": zipf[:300], "min_depth": depth[:300]})
    store_synthetic(store, "m", "r1", small, norms[:300], n_tokens=n_tokens[:300], shard_size=300)
    has_zipf = np.ones(n, bool)
    has_zipf[[2, 40, 1500]] = False
    return store, dict(norms=norms, zipf=zipf, min_depth=depth, score=score, smooth=smooth, n_tokens=n_tokens,
                       has_zipf=has_zipf)


def _intervals(store, **params):
    res = run_query(open_catalog(store), "norm_vs_property_ci", model="m", release="r1", **params)
    return {(r["probe_set"], r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}


def test_m_out_of_n_intervals_equal_an_independent_numpy_implementation(large):
    """Above the switch-over every interval is the m-out-of-n one of numpy and scipy on the same draws: samples
    over the whole set share draws by probe set position, a partial sample and the items with a zipf draw among
    their own items (ordered by item_id); below it the Poisson bootstrap's intervals are unchanged."""
    store, d = large
    seed, resamples, m, switch = 4242, 150, 600, 1000
    got = _intervals(store, resamples=resamples, seed=seed, bootstrap_switch_n=switch, bootstrap_m=m)
    n = len(d["norms"])
    checked = 0
    for prop in ("zipf", "min_depth", "score", "smooth"):
        items = d["has_zipf"] if prop == "zipf" else (np.arange(n) < 1800 if prop == "smooth" else np.ones(n, bool))
        samples = [(items, None)]  # (items, control by zipf)
        if prop != "zipf":
            samples.append((items & d["has_zipf"], "zipf"))
        for keep, control in samples:
            draws = m_out_of_n_draws(seed, resamples, m, int(keep.sum()))
            expected = m_out_of_n_ci(draws, d["norms"][keep], d[prop][keep], d["n_tokens"][keep],
                                     d["zipf"][keep] if control else None)
            for statistic, (low, high, defined) in expected.items():
                if control and statistic != "partial_spearman_zipf":
                    continue  # the items with a zipf give only the frequency control
                row = got[("big", prop, statistic)]
                assert row["ci_low"] == pytest.approx(low, abs=1e-9), (prop, statistic)
                assert row["ci_high"] == pytest.approx(high, abs=1e-9), (prop, statistic)
                assert row["n_resamples"] == defined == resamples
                assert row["ci_method"] == f"m-out-of-n bootstrap m={m}"
                checked += 1
    assert checked == 3 + 3 * 4
    poisson = _intervals(store, resamples=resamples, seed=seed)  # the default switch-over: all Poisson
    small = {k: v for k, v in got.items() if k[0] == "small"}
    assert small and all(row["ci_method"] == replicates.POISSON for row in small.values())
    for key, row in small.items():
        assert (row["ci_low"], row["ci_high"]) == (poisson[key]["ci_low"], poisson[key]["ci_high"])
    assert all(row["ci_method"] == replicates.POISSON for row in poisson.values())


def test_m_out_of_n_draws_equal_the_definition_in_any_chunking(large):
    keys = bootstrap.replicate_keys(SEED, 3, 9)
    got = bootstrap.draw_positions(keys, 1000, 2397)
    np.testing.assert_array_equal(got, m_out_of_n_draws(SEED, 12, 1000, 2397)[3:])
    store, _ = large
    con = open_catalog(store)
    for table in ANALYSIS_STAGED:
        ensure_staged(con, table, "m", "r1")

    def staged(**split):
        replicates.stage_replicates(con, BOOTSTRAP, SEED, 23, switch_n=1000, m=300, **split)
        return con.execute(f"select probe_set, property, statistic, b, value, method from {BOOTSTRAP} "
                           "order by all").fetchall()

    whole = staged(batch_resamples=23, threads=1)
    assert whole == staged(batch_resamples=5, chunk_cells=700, threads=2)  # 2 replicates a chunk
    # draws looked up 3 replicates (900 draws) a pass, in queries of 500 staged items: the same values
    assert whole == staged(batch_resamples=23, threads=2, lookup_draws=900, lookup_block=500)
    assert not con.execute("select * from duckdb_tables() where table_name like 'stg_m_out_of_n%'").fetchall()


def test_m_out_of_n_covers_a_known_correlation(tmp_path):
    """40 samples of 4,000 from a bivariate normal (rho 0.4), m = 800: the rescaled intervals contain the
    population's Spearman rho (6/pi asin(rho/2)) and Pearson r about 95% of the time, and are as wide as the
    Poisson bootstrap's over all 4,000 items and the large-sample widths (Bonett & Wright 2000 for Spearman)."""
    rng = np.random.default_rng(2026)
    rho, n, sets = 0.4, 4000, 40
    store = Store(str(tmp_path / "root"))
    for k in range(sets):
        z = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=n)
        # ln(norm) = 0.1 z1: Pearson r on ln(norm) is rho, and Spearman's rho is that of (z1, z2)
        store_synthetic(store, "m", "r1", word_probe_set(f"s{k:02d}", n, {"x": z[:, 1]}), np.exp(0.1 * z[:, 0]),
                        shard_size=n)
    truth = {"spearman": 6 / np.pi * np.arcsin(rho / 2), "pearson_log_norm": rho}
    sub = _intervals(store, resamples=200, seed=99, bootstrap_switch_n=1000, bootstrap_m=800)
    full = _intervals(store, resamples=200, seed=99)
    assert {row["ci_method"] for row in sub.values()} == {"m-out-of-n bootstrap m=800"}
    assert {row["ci_method"] for row in full.values()} == {replicates.POISSON}
    covered = [sub[(f"s{k:02d}", "x", s)]["ci_low"] < truth[s] < sub[(f"s{k:02d}", "x", s)]["ci_high"]
               for k in range(sets) for s in truth]
    assert 0.85 <= np.mean(covered) <= 1.0, np.mean(covered)
    for statistic, value in truth.items():
        keys = [(f"s{k:02d}", "x", statistic) for k in range(sets)]
        width = np.mean([sub[k]["ci_high"] - sub[k]["ci_low"] for k in keys])
        assert width == pytest.approx(np.mean([full[k]["ci_high"] - full[k]["ci_low"] for k in keys]), rel=0.1)
        spread = np.sqrt(1 + value**2 / 2) if statistic == "spearman" else 1.0
        assert width == pytest.approx(2 * 1.96 * spread * (1 - value**2) / np.sqrt(n - 3), rel=0.1)


@pytest.mark.parametrize("params, name", [
    ({"bootstrap_m": 0}, "bootstrap_m"),
    ({"bootstrap_m": 2**31}, "bootstrap_m"),
    ({"bootstrap_switch_n": 0}, "bootstrap_switch_n"),
    ({"bootstrap_switch_n": 1.5}, "bootstrap_switch_n"),
])
def test_a_switch_over_or_m_that_is_not_a_positive_whole_number_is_refused(large, params, name):
    store, _ = large
    with pytest.raises(ValueError, match=rf"{name}="):
        _intervals(store, resamples=10, seed=1, **params)


@pytest.mark.parametrize("n_codes, m", [(5, 40), (600, 700), (10**6, 300)])  # counted, counted, sorted
def test_ranks_of_drawn_codes_equal_scipy_rankdata(n_codes, m):
    codes = np.random.default_rng(n_codes).integers(0, n_codes, (3, m))
    expected = np.stack([stats.rankdata(row) - (m + 1) / 2 for row in codes])
    np.testing.assert_array_equal(m_out_of_n.centred_ranks(codes, n_codes), expected)
    ascending = np.sort(codes, axis=1)
    np.testing.assert_array_equal(m_out_of_n.centred_ranks(ascending, n_codes, presorted=True),
                                  np.stack([stats.rankdata(row) - (m + 1) / 2 for row in ascending]))


def test_paired_intervals_above_the_switch_over_are_m_out_of_n_on_the_same_draws(tmp_path):
    """A paired comparison of two releases over 1,500 shared items (switch-over 1,000, m = 400): both sides
    draw the same items in each replicate, and the interval is that of D_n + sqrt(m/n) (D*_m - D_n), D the
    difference other - base, as numpy computes it."""
    rng = np.random.default_rng(7)
    n, m, resamples, seed = 1500, 400, 60, 5
    x = rng.normal(size=n)
    base = np.exp(0.1 * x + rng.normal(0, 0.2, n))
    other = np.exp(0.05 * x + rng.normal(0, 0.2, n))
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("p", n, {"x": x})
    store_synthetic(store, "m", "r1", ps, base, shard_size=n)
    store_synthetic(store, "m", "r2", ps, other, shard_size=n)
    frame = paired_comparison(open_catalog(store), ("m", "r1"), ("m", "r2"), resamples=resamples, seed=seed,
                              bootstrap_switch_n=1000, bootstrap_m=m)
    got = {r["statistic"]: r for r in frame.filter(pl.col("analysis") == "norm_vs_property").iter_rows(named=True)}
    draws = m_out_of_n_draws(seed, resamples, m, n)
    for statistic, f in (("spearman", lambda a, v: stats.spearmanr(a, v).statistic),
                         ("pearson_log_norm", lambda a, v: stats.pearsonr(np.log(a), v).statistic)):
        full = f(other, x) - f(base, x)
        diffs = [full + np.sqrt(m / n) * (f(other[i], x[i]) - f(base[i], x[i]) - full) for i in draws]
        low, high = np.quantile(diffs, [0.025, 0.975])
        row = got[statistic]
        assert row["difference"] == pytest.approx(full, abs=1e-9)
        assert row["ci_low"] == pytest.approx(low, abs=1e-9) and row["ci_high"] == pytest.approx(high, abs=1e-9)
        assert row["n_resamples"] == resamples and row["verdict"] == "differs"
