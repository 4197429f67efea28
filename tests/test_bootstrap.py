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

from pipeline.analysis import bootstrap
from pipeline.analysis.sql import ANALYSIS_STAGING, BOOTSTRAP, ensure_staged, load_sql, stage_replicate_keys
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
    for table in ANALYSIS_STAGING:
        ensure_staged(con, table, "m", "r1")
    bootstrap.stage_replicates(con, BOOTSTRAP, SEED, resamples, batch_resamples, **kwargs)
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
