"""The claims table: its controlled correlations and intervals against scipy/numpy on the same resamples, Holm's
adjustment and the verdict rule against an independent implementation, and the population it names."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from pipeline.analysis.analyses import AUDIT_ANALYSES, run_analysis
from pipeline.analysis.claims import CLAIM_TESTS, claims_table, evidence, holm, paired_claims, verdict
from pipeline.probes import ProbeSet
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import poisson_weights, store_synthetic, word_probe_set

SEED, B, N = 20240607, 40, 240


def _nouns(n: int = N, seed: int = 3) -> tuple[ProbeSet, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    props = {"zipf": rng.uniform(1, 7, n), "min_depth": rng.integers(2, 16, n).astype(float),
             "n_senses": rng.integers(1, 9, n).astype(float), "n_all_hyponyms": rng.integers(0, 40, n).astype(float)}
    n_tokens = rng.integers(1, 4, n)
    # frequent words shorter (strongly), deeper ones a little longer; the rest noise
    norms = 6 - 0.4 * props["zipf"] + 0.02 * props["min_depth"] + 0.1 * n_tokens + rng.normal(0, 0.3, n)
    return word_probe_set("wordnet-nouns", n, props), norms, n_tokens, props


def _reference_partial(x, y, controls):
    ranks = [stats.rankdata(v) for v in (x, y, *controls)]
    design = np.column_stack([np.ones(len(x)), *ranks[2:]])
    ex = ranks[0] - design @ np.linalg.lstsq(design, ranks[0], rcond=None)[0]
    ey = ranks[1] - design @ np.linalg.lstsq(design, ranks[1], rcond=None)[0]
    return stats.pearsonr(ex, ey).statistic


def _claims(store: Store, resamples: int = B) -> pl.DataFrame:
    con = open_catalog(store)
    results = pl.concat([r for name in AUDIT_ANALYSES
                         if (r := run_analysis(con, name, "m", "r1", "run-1", resamples=resamples)).height])
    return claims_table(con, results, "m", "r1", "run-1", SEED, resamples)


def test_controlled_statistics_intervals_holm_and_verdicts_match_an_independent_computation(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps, norms, n_tokens, props = _nouns()
    store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
    claims = _claims(store)
    assert set(claims["claim"]) == {"specificity", "frequency"}  # the other sets are not stored
    w = poisson_weights(SEED, B, N)  # items w00000.. in id order
    for row in claims.iter_rows(named=True):
        test = next(t for t in CLAIM_TESTS if (t.claim, t.probe_set, t.property) ==
                    (row["claim"], row["probe_set"], row["property"]))
        controls = [props[c] if c != "n_tokens" else n_tokens for c in test.controls]
        assert row["value"] == pytest.approx(_reference_partial(norms, props[test.property], controls), abs=1e-9)
        reps = np.array([_reference_partial(np.repeat(norms, w[b]), np.repeat(props[test.property], w[b]),
                                            [np.repeat(c, w[b]) for c in controls]) for b in range(B)])
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(np.quantile(reps, [0.025, 0.975])), abs=1e-9)
        p = min(1.0, 2 * min(np.mean(reps <= 0), np.mean(reps >= 0)))
        assert row["p_value"] == pytest.approx(p, abs=1e-12) and row["n"] == N and row["n_resamples"] == B
        assert row["population"] == f"wordnet-nouns: {N:,} items with {test.property}"
    # Holm within each claim, by hand: sort, multiply by the remaining count, carry the running maximum
    for _claim, part in claims.group_by("claim"):
        p = part["p_value"].to_numpy()
        order = np.argsort(p, kind="stable")
        adjusted = np.maximum.accumulate(np.minimum(1, (len(p) - np.arange(len(p))) * p[order]))
        expected = np.empty_like(p)
        expected[order] = adjusted
        np.testing.assert_allclose(part["p_holm"].to_numpy(), expected, rtol=0, atol=1e-12)
    frequency = claims.filter(pl.col("claim") == "frequency").row(0, named=True)
    assert frequency["value"] < -0.5 and frequency["evidence"] == "supports" and frequency["verdict"] == "supported"
    assert frequency["controls"] == "n_tokens" and frequency["direction"] == "-"


def test_a_limited_audit_names_its_sample_in_the_population(tmp_path):
    """--limit embeds the first N items of a set in its stable order: the claim's population says so."""
    store = Store(str(tmp_path / "root"))
    ps, norms, n_tokens, _ = _nouns()
    first = ProbeSet(name=ps.name, items=ps.items.head(160),
                     properties=ps.properties.filter(pl.col("item_id").is_in(ps.items["item_id"].head(160))))
    store_synthetic(store, "m", "r1", first, norms[:160], n_tokens=n_tokens[:160])
    from pipeline.probes import write_probe_tables

    write_probe_tables(store, ps)  # the whole set is stored; only its first 160 items were embedded
    claims = _claims(store, resamples=20)
    row = claims.filter(pl.col("claim") == "frequency").row(0, named=True)
    assert row["population"] == ("wordnet-nouns: 160 items with zipf (of the first 160 of 240 items, "
                                 "most frequent first: --limit)")


def test_holm_and_the_verdict_rule():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.2, float("nan"), 0.01]) == pytest.approx([0.2, float("nan"), 0.02], nan_ok=True)
    assert evidence(-0.3, 0.0, -1, 0.01) == "supports" and evidence(0.3, 0.0, -1, 0.01) == "contradicts"
    assert evidence(0.3, 0.0, 1, 0.05) == "none" and evidence(0.6, 0.5, 1, 0.001) == "supports"
    assert verdict(["supports", "none"]) == "supported" and verdict(["contradicts"]) == "contradicted"
    assert verdict(["supports", "contradicts"]) == "mixed" and verdict(["none", "none"]) == "no evidence"


def test_paired_claims_match_a_numpy_paired_bootstrap(tmp_path):
    """Two releases of the same items: each controlled test's difference (other - base) and its paired interval
    equal a numpy bootstrap drawing the same resample on both sides; a release against itself gives [0, 0]."""
    store = Store(str(tmp_path / "root"))
    ps, norms, n_tokens, props = _nouns()
    rng = np.random.default_rng(11)
    other = norms + 0.3 * props["zipf"] + rng.normal(0, 0.2, N)  # the frequency relation weakened
    store_synthetic(store, "m", "r1", ps, norms, n_tokens=n_tokens)
    store_synthetic(store, "m", "r2", ps, other, n_tokens=n_tokens)
    con = open_catalog(store)
    paired = paired_claims(con, ("m", "r1"), ("m", "r2"), SEED, B)
    assert set(paired["claim"]) == {"frequency", "specificity"}
    w = poisson_weights(SEED, B, N)
    for row in paired.iter_rows(named=True):
        test = next(t for t in CLAIM_TESTS if (t.claim, t.property) == (row["claim"], row["property"]))
        controls = [props[c] if c != "n_tokens" else n_tokens for c in test.controls]
        side = [np.array([_reference_partial(np.repeat(x, w[b]), np.repeat(props[test.property], w[b]),
                                             [np.repeat(c, w[b]) for c in controls]) for b in range(B)])
                for x in (norms, other)]
        diff = side[1] - side[0]
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(np.quantile(diff, [0.025, 0.975])), abs=1e-9)
        assert row["difference"] == pytest.approx(
            _reference_partial(other, props[test.property], controls)
            - _reference_partial(norms, props[test.property], controls), abs=1e-9)
    assert paired.filter(pl.col("claim") == "frequency")["ci_low"][0] > 0  # other's norm tracks zipf less
    same = paired_claims(con, ("m", "r1"), ("m", "r1"), SEED, B)
    assert (same["difference"] == 0).all() and (same["ci_low"] == 0).all() and (same["ci_high"] == 0).all()


def _retrieval_set(store: Store, release: str, noise_scale: float, seed: int = 21) -> None:
    """A Cranfield-named retrieval set: queries near their one relevant document, noisier ones shorter."""
    rng = np.random.default_rng(seed)
    n_docs, n_queries, dim = 80, 50, 8
    docs = rng.normal(size=(n_docs, dim))
    target = np.arange(n_queries) % n_docs
    noise = np.random.default_rng(7).uniform(0.2, 3.0, n_queries) * noise_scale
    queries = docs[target] / np.linalg.norm(docs[target], axis=1, keepdims=True) + noise[:, None] * rng.normal(
        size=(n_queries, dim)) / np.sqrt(dim)
    queries *= (3.0 - 0.5 * noise)[:, None] / np.linalg.norm(queries, axis=1, keepdims=True)
    q_ids, d_ids = [f"q:{i:03d}" for i in range(n_queries)], [f"d:{i:03d}" for i in range(n_docs)]
    items = pl.DataFrame({"item_id": q_ids + d_ids, "text": [f"t{i}" for i in range(n_queries + n_docs)],
                          "kind": ["query"] * n_queries + ["doc"] * n_docs, "lang": "en", "source": "synthetic"})
    relations = pl.DataFrame({"left_id": q_ids, "right_id": [d_ids[t] for t in target], "relation": "relevant",
                              "value": 1.0})
    vectors = np.vstack([queries, docs]).astype(np.float32)
    store_synthetic(store, "m", release, ProbeSet(name="cranfield", items=items, relations=relations),
                    np.linalg.norm(vectors.astype(np.float64), axis=1), vectors=vectors)


def test_retrieval_claims_and_their_paired_difference_match_sklearn(tmp_path):
    """The retrieval claim's AUROC row is the stored one, its p the bootstrap p of sklearn AUROCs on the same
    resamples, and the paired difference between two releases a numpy paired bootstrap of them."""
    store = Store(str(tmp_path / "root"))
    _retrieval_set(store, "r1", 1.0)
    _retrieval_set(store, "r2", 1.3)
    con = open_catalog(store)
    claims = _claims(store).filter(pl.col("claim") == "retrieval_calibration")
    row = claims.filter(pl.col("statistic") == "auroc_query_norm").row(0, named=True)
    per_query = {}
    for release in ("r1", "r2"):
        run_analysis(con, "retrieval_calibration", "m", release, "x", resamples=B)
        per_query[release] = con.execute("select success_at_1, query_norm from retrieval_queries where alpha = 0 "
                                         "order by query_id").fetchnumpy()
    w = poisson_weights(SEED, B, len(per_query["r1"]["query_norm"]))

    def reps(release):
        y, x = per_query[release]["success_at_1"], per_query[release]["query_norm"]
        return np.array([roc_auc_score(np.repeat(y, w[b]), np.repeat(x, w[b])) for b in range(B)])

    r1, r2 = reps("r1"), reps("r2")
    y1 = per_query["r1"]["success_at_1"]
    assert row["value"] == pytest.approx(roc_auc_score(y1, per_query["r1"]["query_norm"]), abs=1e-9)
    assert row["p_value"] == pytest.approx(min(1.0, 2 * min(np.mean(r1 <= 0.5), np.mean(r1 >= 0.5))), abs=1e-12)
    assert row["population"] == "cranfield: 50 queries"
    paired = paired_claims(con, ("m", "r1"), ("m", "r2"), SEED, B)
    diff = paired.filter(pl.col("statistic") == "auroc_query_norm").row(0, named=True)
    assert (diff["ci_low"], diff["ci_high"]) == pytest.approx(tuple(np.quantile(r2 - r1, [0.025, 0.975])), abs=1e-9)
    assert set(paired["statistic"]) == {"auroc_query_norm", "cv_auroc_gain_query_norm"}
