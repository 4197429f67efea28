"""Paired comparison (pipeline/analysis/paired.py) against a numpy paired bootstrap with the same weights (1e-9).

The weights are re-derived in numpy from their documented hash (tests/test_norm_vs_property_ci.py's
``poisson_weights``); each side's statistic is recomputed with scipy/sklearn on ``numpy.repeat``'ed shared
units, replicate by replicate, and the interval is ``numpy.quantile`` of the per-replicate differences.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from pipeline.analysis.paired import PAIRED_COLUMNS, paired_comparison, write_comparison
from pipeline.analysis.retrieval import register_retrieval_tables
from pipeline.analysis.sql import run_query
from pipeline.probes import ProbeSet, write_probe_tables
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import poisson_weights, store_synthetic, word_probe_set

RESAMPLES, SEED = 200, 4242
N, N_SUBSET = 120, 100  # model "c" embeds only the first N_SUBSET items of probe set "w"
N_PAIRS, N_WORDS, N_QUERIES, N_DOCS = 60, 90, 40, 80


def _tokens(store, model, tokens, norms):
    store.write_table(f"{store.token_norms_dir(model, 'r1')}/part-0.parquet", pl.DataFrame(
        {"model": model, "release": "r1", "token_id": np.arange(len(tokens)), "token": tokens, "norm": norms}
    ).to_arrow())


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Models a, b, c: b's norms run against a's on every analysis; c embeds part of "w" only."""
    rng = np.random.default_rng(3)
    store = Store(str(tmp_path_factory.mktemp("paired") / "root"))
    data = {}
    # norm_vs_property: a's norm tracks depth, b's runs against it
    zipf = np.round(rng.uniform(1, 7, N), 1)
    depth = rng.integers(2, 12, N).astype(float)
    ps = word_probe_set("w", N, {"zipf": zipf, "min_depth": depth})
    norms = {"a": 1 + 0.05 * depth + rng.normal(0, 0.08, N), "b": 2 - 0.05 * depth + rng.normal(0, 0.08, N)}
    norms["c"] = norms["a"] + rng.normal(0, 0.05, N)
    # the subset first: the probe tables are then rewritten whole by the later calls
    subset = ps.items.head(N_SUBSET)
    store_synthetic(store, "c", "r1", ProbeSet("w", subset, ps.properties.filter(
        pl.col("item_id").is_in(subset["item_id"].implode()))), norms["c"][:N_SUBSET])
    for model in ("a", "b"):
        store_synthetic(store, model, "r1", ps, norms[model])
    data["w"] = dict(zipf=zipf, depth=depth, norms=norms)
    # hypernym_pairs: pair i = (hypernym p(2i), hyponym p(2i+1))
    pz = rng.uniform(2, 6, 2 * N_PAIRS)
    pz[1::2] = pz[0::2] + rng.normal(0, 0.3, N_PAIRS)
    pairs = word_probe_set("pairs", 2 * N_PAIRS, {"zipf": pz})
    ids = pairs.items["item_id"].to_list()
    pairs = ProbeSet("pairs", pairs.items, pairs.properties, relations=pl.DataFrame(
        {"left_id": ids[0::2], "right_id": ids[1::2], "relation": "hypernym_of", "value": 1.0}))
    step = np.tile([0.0, 1.0], N_PAIRS)
    pn = {"a": 1 + 0.1 * step + rng.normal(0, 0.1, 2 * N_PAIRS), "b": 1 - 0.1 * step + rng.normal(0, 0.1, 2 * N_PAIRS)}
    for model in ("a", "b"):
        store_synthetic(store, model, "r1", pairs, pn[model])
    data["pairs"] = dict(zipf=pz, norms=pn)
    # token_norm_vs_frequency: a WordPiece vocabulary (a) and a SentencePiece one (b) sharing 70 words
    words = [f"tok{i:03d}" for i in range(N_WORDS)]
    wz = rng.uniform(1, 7, N_WORDS)
    tok = word_probe_set("tok", N_WORDS, {"zipf": wz})
    tok.items = tok.items.with_columns(pl.Series("text", words))
    write_probe_tables(store, tok)
    in_a, in_b = np.arange(0, 80), np.arange(10, 90)
    tn = {"a": 2 - 0.1 * wz[in_a] + rng.normal(0, 0.1, 80), "b": 2 + 0.1 * wz[in_b] + rng.normal(0, 0.1, 80)}
    _tokens(store, "a", [words[i] for i in in_a] + ["##x", "[CLS]"], np.r_[tn["a"], 1.0, 1.0])
    _tokens(store, "b", ["▁" + words[i] for i in in_b] + ["x"], np.r_[tn["b"], 1.0])
    data["tok"] = dict(zipf=wz, in_a=in_a, in_b=in_b, norms=tn)
    # retrieval_calibration: queries near their document; a's norms say how near, b's do not
    docs = rng.normal(size=(N_DOCS, 8))
    target = rng.integers(0, N_DOCS, N_QUERIES)
    noise = rng.uniform(0.2, 3.0, N_QUERIES)
    q_ids, d_ids = [f"q{i:03d}" for i in range(N_QUERIES)], [f"d{i:03d}" for i in range(N_DOCS)]
    items = pl.DataFrame({"item_id": q_ids + d_ids, "text": [f"t{i}" for i in range(N_QUERIES + N_DOCS)],
                          "kind": ["query"] * N_QUERIES + ["doc"] * N_DOCS, "lang": "en", "source": "synthetic"})
    rel = pl.DataFrame({"left_id": q_ids, "right_id": [d_ids[t] for t in target], "value": 1.0,
                        "relation": "relevant"})
    ir = ProbeSet("ir", items, relations=rel)
    base = docs[target] / np.linalg.norm(docs[target], axis=1, keepdims=True)
    queries = base + noise[:, None] * rng.normal(size=(N_QUERIES, 8)) / np.sqrt(8)
    for model, scale in (("a", 2.5 - 0.5 * noise), ("b", 1 + 0.5 * noise)):
        q = queries * (scale / np.linalg.norm(queries, axis=1))[:, None]
        vectors = np.vstack([q, docs]).astype(np.float32)
        store_synthetic(store, model, "r1", ir, np.linalg.norm(vectors.astype(np.float64), axis=1), vectors=vectors)
    return store, data


@pytest.fixture(scope="module")
def a_vs_b(stored):
    store, _ = stored
    frame = paired_comparison(open_catalog(store), ("a", "r1"), ("b", "r1"), resamples=RESAMPLES, seed=SEED)
    return {(r["analysis"], r["probe_set"], r["property"], r["statistic"]): r for r in frame.iter_rows(named=True)}


def _paired_interval(weights, statistic, base, other):
    """numpy paired bootstrap: the statistic of each side on the same repeated units, per replicate."""
    diffs = []
    for w in weights:
        idx = np.repeat(np.arange(len(w)), w)
        d = statistic(*(col[idx] for col in other)) - statistic(*(col[idx] for col in base))
        if np.isfinite(d):
            diffs.append(d)
    return (*np.quantile(diffs, [0.025, 0.975]), len(diffs))


def _check(row, weights, statistic, base, other):
    low, high, n_defined = _paired_interval(weights, statistic, base, other)
    assert row["ci_low"] == pytest.approx(low, abs=1e-9)
    assert row["ci_high"] == pytest.approx(high, abs=1e-9)
    assert row["n_resamples"] == n_defined
    point = statistic(*other) - statistic(*base)
    assert row["difference"] == pytest.approx(point, abs=1e-9)
    assert row["difference"] == row["value"] - row["base_value"]


def spearman(x, y):
    return stats.spearmanr(x, y).statistic


def test_norm_vs_property_interval_equals_numpy_paired_bootstrap(stored, a_vs_b):
    _, data = stored
    d = data["w"]
    weights = poisson_weights(SEED, RESAMPLES, N)
    row = a_vs_b[("norm_vs_property", "w", "min_depth", "spearman")]
    _check(row, weights, spearman, (d["norms"]["a"], d["depth"]), (d["norms"]["b"], d["depth"]))
    row = a_vs_b[("norm_vs_property", "w", "zipf", "pearson_log_norm")]
    _check(row, weights, lambda x, y: stats.pearsonr(np.log(x), y).statistic,
           (d["norms"]["a"], d["zipf"]), (d["norms"]["b"], d["zipf"]))
    assert (row["n_shared"], row["n_only_base"], row["n_only_other"]) == (N, 0, 0)


def test_hypernym_share_interval_equals_numpy_paired_bootstrap(stored, a_vs_b):
    _, data = stored
    d = data["pairs"]
    weights = poisson_weights(SEED, RESAMPLES, N_PAIRS)  # pairs ordered by (hypernym, hyponym) id: pair order
    greater = {m: (d["norms"][m][1::2] > d["norms"][m][0::2]).astype(float) for m in ("a", "b")}
    row = a_vs_b[("hypernym_pairs", "pairs", "hypernym_of", "share_hyponym_norm_greater")]
    _check(row, weights, np.mean, (greater["a"],), (greater["b"],))
    assert row["verdict"] == "differs" and row["n_shared"] == N_PAIRS


def test_token_spearman_interval_equals_numpy_on_the_words_both_vocabularies_match(stored, a_vs_b):
    _, data = stored
    d = data["tok"]
    shared = np.arange(10, 80)  # words sorted as their indices: tok010 .. tok079
    weights = poisson_weights(SEED, RESAMPLES, len(shared))
    na, nb = d["norms"]["a"][shared - d["in_a"][0]], d["norms"]["b"][shared - d["in_b"][0]]
    row = a_vs_b[("token_norm_vs_frequency", "tok", "zipf", "spearman")]
    _check(row, weights, spearman, (na, d["zipf"][shared]), (nb, d["zipf"][shared]))
    assert (row["n_shared"], row["n_only_base"], row["n_only_other"]) == (70, 10, 10)
    assert row["verdict"] == "differs"


def _per_query(store, model):
    con = open_catalog(store)
    register_retrieval_tables(con, model, "r1")
    return con.sql("select * from retrieval_queries where alpha = 0 order by query_id").pl()


def test_retrieval_intervals_equal_numpy_paired_bootstrap(stored, a_vs_b):
    store, _ = stored
    qa, qb = _per_query(store, "a"), _per_query(store, "b")
    assert qa["query_id"].to_list() == qb["query_id"].to_list()
    weights = poisson_weights(SEED, RESAMPLES, qa.height)

    def auroc(success, score):
        return roc_auc_score(success, score) if 0 < success.sum() < len(success) else np.nan

    cols = {m: (q["success_at_1"].to_numpy(), q["query_norm"].to_numpy()) for m, q in (("a", qa), ("b", qb))}
    _check(a_vs_b[("retrieval_calibration", "ir", "success_at_1", "auroc_query_norm")], weights, auroc,
           cols["a"], cols["b"])
    _check(a_vs_b[("retrieval_calibration", "ir", "retrieval", "mean_success_at_1")], weights, np.mean,
           cols["a"][:1], cols["b"][:1])
    assert ("retrieval_calibration", "ir", "selective_accuracy_query_norm", "mean_selective_accuracy") in a_vs_b
    assert not any(key[3].startswith("coverage_") for key in a_vs_b)


def test_a_release_compared_with_itself_differs_by_exactly_zero(stored):
    store, _ = stored
    frame = paired_comparison(open_catalog(store), ("a", "r1"), ("a", "r1"), resamples=RESAMPLES, seed=SEED)
    assert set(frame["analysis"]) == {"norm_vs_property", "hypernym_pairs", "token_norm_vs_frequency",
                                      "retrieval_calibration"}
    assert (frame["difference"] == 0).all() and (frame["ci_low"] == 0).all() and (frame["ci_high"] == 0).all()
    assert set(frame["verdict"]) == {"no evidence"}
    assert (frame["n_only_base"] == 0).all() and (frame["n_only_other"] == 0).all()


def test_reversed_norms_differ(a_vs_b):
    for statistic in ("spearman", "pearson_log_norm", "partial_spearman_zipf"):
        row = a_vs_b[("norm_vs_property", "w", "min_depth", statistic)]
        assert row["base_value"] > 0 > row["value"] and row["verdict"] == "differs", statistic
        assert row["ci_high"] < 0


def test_items_one_side_embedded_are_counted_not_used(stored):
    """c embedded the first 100 items of "w": a's statistics are taken on those 100 only, and the other
    20 are counted; the result equals the audit's own statistic over just those items."""
    store, data = stored
    d = data["w"]
    con = open_catalog(store)
    frame = paired_comparison(con, ("a", "r1"), ("c", "r1"), resamples=RESAMPLES, seed=SEED)
    rows = {(r["property"], r["statistic"]): r for r in frame.filter(pl.col("analysis") == "norm_vs_property")
            .iter_rows(named=True)}
    row = rows[("min_depth", "spearman")]
    keep = slice(0, N_SUBSET)
    assert row["base_value"] == pytest.approx(spearman(d["norms"]["a"][keep], d["depth"][keep]), abs=1e-12)
    assert row["value"] == pytest.approx(spearman(d["norms"]["c"][keep], d["depth"][keep]), abs=1e-12)
    assert (row["n_shared"], row["n_only_base"], row["n_only_other"]) == (N_SUBSET, N - N_SUBSET, 0)
    _check(row, poisson_weights(SEED, RESAMPLES, N_SUBSET), spearman,
           (d["norms"]["a"][keep], d["depth"][keep]), (d["norms"]["c"][keep], d["depth"][keep]))
    # the connection's audit queries see the whole release again afterwards
    audit = run_query(con, "norm_vs_property", model="a", release="r1")
    full = audit.filter((pl.col("property") == "min_depth") & (pl.col("statistic") == "spearman")).row(0, named=True)
    assert full["n"] == N and full["value"] == pytest.approx(spearman(d["norms"]["a"], d["depth"]), abs=1e-12)


def test_comparison_rows_are_stored_and_read_back(stored, a_vs_b, tmp_path):
    store, _ = stored
    frame = pl.DataFrame(list(a_vs_b.values())).select(list(PAIRED_COLUMNS)).cast(PAIRED_COLUMNS)
    write_comparison(store, "run-cmp", frame)
    back = open_catalog(store).sql("select * exclude (run_id) from comparisons where run_id = 'run-cmp'").pl()
    assert back.sort(["analysis", "probe_set", "property", "statistic"]).equals(
        frame.sort(["analysis", "probe_set", "property", "statistic"]))
    store.rm("comparisons/run-cmp.parquet")


@pytest.mark.parametrize("kwargs, match", [
    ({"base": ("nope", "r1"), "other": ("a", "r1")}, "base: no embeddings stored for model 'nope'"),
    ({"base": ("a", "r1"), "other": ("a",)}, r"other=\('a',\): give a \(model, release\)"),
    ({"base": ("a", "r1"), "other": ("b", "r1"), "resamples": 0}, "resamples=0: give a whole number"),
])
def test_bad_sides_are_refused_with_what_to_do(stored, kwargs, match):
    store, _ = stored
    with pytest.raises(ValueError, match=match):
        paired_comparison(open_catalog(store), **kwargs)
