"""Retrieval search, retrieval_calibration and norm_rescoring against numpy, sklearn and scipy (to 1e-9)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import roc_auc_score

from pipeline.analysis.analyses import run_analysis
from pipeline.analysis.retrieval import ALPHAS, exact_topk
from pipeline.analysis.sql import run_query
from pipeline.probes import ProbeSet, write_probe_tables
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import store_synthetic

N_DOCS, N_QUERIES, DIM = 120, 60, 12


@pytest.fixture(scope="module")
def retrieval_store(tmp_path_factory):
    """Queries near their relevant document, noisier ones shorter; graded qrels; one judged doc not stored."""
    rng = np.random.default_rng(21)
    docs = rng.normal(size=(N_DOCS, DIM)) * rng.uniform(0.5, 2.0, size=(N_DOCS, 1))
    target = rng.integers(0, N_DOCS, N_QUERIES)
    noise = rng.uniform(0.2, 3.0, N_QUERIES)
    queries = docs[target] / np.linalg.norm(docs[target], axis=1, keepdims=True) + noise[
        :, None
    ] * rng.normal(size=(N_QUERIES, DIM)) / np.sqrt(DIM)
    queries *= (2.5 - 0.5 * noise)[:, None] / np.linalg.norm(queries, axis=1, keepdims=True)
    q_ids = [f"q{i:03d}" for i in range(N_QUERIES)]
    d_ids = [f"d{i:04d}" for i in range(N_DOCS)]
    items = pl.DataFrame(
        {
            "item_id": q_ids + d_ids,
            "text": [f"text {i}" for i in range(N_QUERIES + N_DOCS)],
            "kind": ["query"] * N_QUERIES + ["doc"] * N_DOCS,
            "lang": "en",
            "source": "synthetic",
        }
    )
    rel = [(q_ids[i], d_ids[target[i]], 2.0) for i in range(N_QUERIES)]
    rel += [(q_ids[i], d_ids[(target[i] + 1) % N_DOCS], 1.0) for i in range(0, N_QUERIES, 3)]
    rel += [(q_ids[1], d_ids[5], 0.0)]  # judged not relevant
    relations = pl.DataFrame(rel, schema=["left_id", "right_id", "value"], orient="row").with_columns(
        pl.lit("relevant").alias("relation")
    )
    ps = ProbeSet(name="toy-ir", items=items, relations=relations)
    # a judged document that is an item but was never embedded (as after --limit): it must not count
    unembedded = pl.DataFrame(
        {"item_id": ["d9999"], "text": ["missing"], "kind": ["doc"], "lang": ["en"], "source": ["synthetic"]}
    )
    full = ProbeSet(
        name="toy-ir",
        items=pl.concat([items, unembedded]),
        relations=pl.concat(
            [
                relations,
                pl.DataFrame(
                    {"left_id": [q_ids[0]], "right_id": ["d9999"], "value": [3.0], "relation": ["relevant"]}
                ).select(relations.columns),
            ]
        ),
    )
    vectors = np.vstack([queries, docs]).astype(np.float32)
    n_tokens = np.concatenate([rng.integers(3, 12, N_QUERIES), np.full(N_DOCS, 5)])
    store = Store(str(tmp_path_factory.mktemp("ir") / "root"))
    store_synthetic(
        store,
        "m",
        "r1",
        ps,
        np.linalg.norm(vectors.astype(np.float64), axis=1),
        vectors=vectors,
        n_tokens=n_tokens,
    )
    write_probe_tables(store, full)
    return store, vectors.astype(np.float64), relations, n_tokens[:N_QUERIES]


def _reference(vectors, relations, n_tokens):
    """Per alpha and query: success@1, success@10, nDCG@10, top-1 score, margin; all in float64 numpy."""
    q, d = vectors[:N_QUERIES], vectors[N_QUERIES:]
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    dnorm = np.linalg.norm(d, axis=1)
    qrels = {}
    for row in relations.iter_rows(named=True):
        doc = int(row["right_id"][1:])
        if row["value"] > 0 and doc < N_DOCS:
            qrels.setdefault(int(row["left_id"][1:]), {})[doc] = row["value"]
    out = {}
    for a in ALPHAS:
        scores = cos * dnorm**a
        rows = []
        for i in sorted(qrels):
            order = np.lexsort((np.arange(N_DOCS), -scores[i]))[:10]
            gains = np.array([qrels[i].get(j, 0.0) for j in order])
            ideal = np.sort(np.array(list(qrels[i].values())))[::-1][:10]
            discounts = 1 / np.log2(np.arange(2, 12))
            rows.append(
                {
                    "query": i,
                    "s1": float(gains[0] > 0),
                    "s10": float((gains > 0).any()),
                    "ndcg": (gains * discounts[: len(gains)]).sum() / (ideal * discounts[: len(ideal)]).sum(),
                    "top1": scores[i, order[0]],
                    "margin": scores[i, order[0]] - scores[i, order[1]],
                    "norm": np.linalg.norm(q[i]),
                    "n_tokens": n_tokens[i],
                }
            )
        out[a] = pl.DataFrame(rows)
    return out


def test_exact_topk_matches_full_sort_including_ties():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(50, 8))
    docs[7] = docs[3]  # duplicate documents tie exactly
    queries = np.vstack([docs[3] + 1e-3, rng.normal(size=(5, 8))])
    norms = np.linalg.norm(docs, axis=1)
    got = exact_topk(queries, docs, norms, k=5, alphas=(0.0, 1.0))
    for a, (idx, sc) in got.items():
        cos = (
            (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (docs / norms[:, None]).T * norms**a
        )
        for i in range(len(queries)):
            expected = np.lexsort((np.arange(50), -cos[i]))[:5]
            assert idx[i].tolist() == expected.tolist()
            np.testing.assert_allclose(sc[i], cos[i, expected], rtol=0, atol=1e-12)
    assert got[0.0][0][0][:2].tolist() == [3, 7]


def test_duckdb_topk_agrees_with_numpy_search(retrieval_store):
    store, vectors, _, _ = retrieval_store
    res = run_query(open_catalog(store), "retrieval_topk", model="m", release="r1", k=10)
    idx, sc = exact_topk(
        vectors[:N_QUERIES], vectors[N_QUERIES:], np.linalg.norm(vectors[N_QUERIES:], axis=1)
    )[0.0]
    top1 = res.filter(pl.col("rank") == 1).sort("query_id")
    assert top1["doc_id"].to_list() == [f"d{j:04d}" for j in idx[:, 0]]
    # DuckDB computes list_cosine_similarity in float32
    np.testing.assert_allclose(res.sort(["query_id", "rank"])["score"].to_numpy(), sc.reshape(-1), atol=1e-5)


def test_retrieval_calibration_matches_sklearn_and_numpy(retrieval_store):
    store, vectors, relations, n_tokens = retrieval_store
    ref = _reference(vectors, relations, n_tokens)[0.0]
    res = run_analysis(open_catalog(store), "retrieval_calibration", "m", "r1", "run-1")
    got = {(r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}
    n = ref.height
    for measure, col in (("success_at_1", "s1"), ("success_at_10", "s10"), ("ndcg_at_10", "ndcg")):
        row, x = got[("retrieval", f"mean_{measure}")], ref[col].to_numpy()
        half = 1.959963984540054 * x.std(ddof=1) / np.sqrt(n)
        assert (row["value"], row["ci_low"], row["ci_high"], row["n"]) == pytest.approx(
            (x.mean(), x.mean() - half, x.mean() + half, n), abs=1e-9
        )
    assert 0 < ref["s1"].mean() < 1  # both outcomes occur, so every AUROC is defined
    for target, col in (("success_at_1", "s1"), ("success_at_10", "s10")):
        y = ref[col].to_numpy()
        if y.min() == y.max():
            assert (target, "auroc_query_norm") not in got
            continue
        for signal, sig_col in (
            ("query_norm", "norm"),
            ("top1_cosine", "top1"),
            ("top1_margin", "margin"),
            ("query_n_tokens", "n_tokens"),
        ):
            expected = roc_auc_score(y, ref[sig_col].to_numpy())
            assert got[(target, f"auroc_{signal}")]["value"] == pytest.approx(expected, abs=1e-9), (
                target,
                signal,
            )
    assert got[("success_at_1", "auroc_query_norm")]["value"] > 0.6  # the fixture's norms carry signal
    for signal, sig_col in (("query_norm", "norm"), ("top1_cosine", "top1")):
        order = np.lexsort((ref["query"].to_numpy(), -ref[sig_col].to_numpy()))
        s1 = ref["s1"].to_numpy()[order]
        points = []
        for tenths in range(1, 11):
            keep = (tenths * n + 9) // 10
            row = got[(f"selective_accuracy_{signal}", f"coverage_{tenths / 10:.1f}")]
            assert (row["value"], row["n"]) == (pytest.approx(s1[:keep].mean(), abs=1e-9), keep)
            points.append(s1[:keep].mean())
        assert got[(f"selective_accuracy_{signal}", "mean_selective_accuracy")]["value"] == pytest.approx(
            np.mean(points), abs=1e-9
        )


def test_norm_rescoring_matches_numpy_ndcg(retrieval_store):
    store, vectors, relations, n_tokens = retrieval_store
    ref = _reference(vectors, relations, n_tokens)
    res = run_analysis(open_catalog(store), "norm_rescoring", "m", "r1", "run-1")
    got = {(r["property"], r["statistic"]): r for r in res.iter_rows(named=True)}
    base = ref[0.0]["ndcg"].to_numpy()
    for a in ALPHAS:
        x = ref[a]["ndcg"].to_numpy()
        row = got[(f"alpha={a:+.2f}", "mean_ndcg_at_10")]
        half = 1.959963984540054 * x.std(ddof=1) / np.sqrt(len(x))
        assert (row["value"], row["ci_low"], row["ci_high"]) == pytest.approx(
            (x.mean(), x.mean() - half, x.mean() + half), abs=1e-9
        )
        if a != 0.0:
            delta = got[(f"alpha={a:+.2f}", "delta_ndcg_at_10_vs_cosine")]
            assert delta["value"] == pytest.approx((x - base).mean(), abs=1e-9)
    assert ("alpha=+0.00", "delta_ndcg_at_10_vs_cosine") not in got
    # the grid reaches rankings that differ from cosine
    assert len({round(got[(f"alpha={a:+.2f}", "mean_ndcg_at_10")]["value"], 9) for a in ALPHAS}) > 1
