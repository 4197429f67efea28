"""Exact top-k retrieval over stored vectors, for the retrieval analyses.

The search is a matrix product in batches of queries (numpy), which
``benchmarks/topk_search.py`` measured many times faster than the same search
inside DuckDB (``sql/retrieval_topk.sql``). Scores are computed in float64 from
the stored vectors, so rankings do not depend on summation order and match any
float64 reference exactly. One product per batch serves every scoring rule:
cosine, and cosine * ||d||^alpha for each alpha of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.analysis.sql import empty_result, load_sql, run_query

# Exponents of the document norm for norm_rescoring; 0 is plain cosine.
ALPHAS = (-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
TOP_K = 10
# Scores held at once per batch: batch queries x documents float64 (256 MiB).
BATCH_SCORES = 1 << 25

RANKING_SCHEMA = {
    "probe_set": pl.String,
    "alpha": pl.Float64,
    "query_id": pl.String,
    "rank": pl.Int32,
    "doc_id": pl.String,
    "score": pl.Float64,
}


@dataclass
class RetrievalSet:
    """The queries and documents of one retrieval probe set, as matrices of the stored vectors."""

    probe_set: str
    query_ids: list[str]
    queries: np.ndarray
    doc_ids: list[str]
    docs: np.ndarray
    doc_norms: np.ndarray


def _matrix(vectors: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A list<float> column of equal-length rows as a 2-D float64 array (no per-row Python objects)."""
    arr = vectors.combine_chunks() if isinstance(vectors, pa.ChunkedArray) else vectors
    if len(arr) == 0:
        return np.zeros((0, 0), dtype=np.float64)
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    return flat.reshape(len(arr), -1)


def load_retrieval_sets(con: duckdb.DuckDBPyConnection, model: str, release: str) -> list[RetrievalSet]:
    """Every probe set of the release that has both queries and documents embedded."""
    # a probe set without both kinds of item cannot be one: no read of the release's embeddings (~11 s at 10 M
    # items) when none has them, as in most audits
    if not con.execute("select probe_set from probe_items where kind in ('query', 'doc') group by probe_set "
                       "having count(distinct kind) = 2 limit 1").fetchall():
        return []
    table = con.sql(
        load_sql("retrieval_vectors"), params={"model": model, "release": release}
    ).to_arrow_table()
    sets = []
    for probe_set in sorted(set(table["probe_set"].to_pylist())):
        part = table.filter(pa.compute.equal(table["probe_set"], probe_set))
        q = part.filter(pa.compute.equal(part["kind"], "query"))
        d = part.filter(pa.compute.equal(part["kind"], "doc"))
        sets.append(
            RetrievalSet(
                probe_set,
                q["item_id"].to_pylist(),
                _matrix(q["vector"]),
                d["item_id"].to_pylist(),
                _matrix(d["vector"]),
                d["norm"].to_numpy().astype(np.float64),
            )
        )
    return sets


def _top_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best columns of each row, best first, equal scores by column index."""
    n = scores.shape[1]
    # argpartition finds the k best in linear time; only those k are then sorted
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < n else np.tile(np.arange(n), (len(scores), 1))
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -top_scores), axis=1)
    top, top_scores = np.take_along_axis(top, order, axis=1), np.take_along_axis(top_scores, order, axis=1)
    # a tie at the k-th score (duplicate documents) may have kept a later column: redo those rows in full
    tied = (scores >= top_scores[:, -1:]).sum(axis=1) > k
    for row in np.flatnonzero(tied):
        full = np.lexsort((np.arange(n), -scores[row]))[:k]
        top[row], top_scores[row] = full, scores[row, full]
    return top, top_scores


def exact_topk(
    queries: np.ndarray,
    docs: np.ndarray,
    doc_norms: np.ndarray,
    k: int = TOP_K,
    alphas: tuple[float, ...] = (0.0,),
) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """Exact top-k documents per query for each scoring rule cos(q, d) * ||d||^alpha.

    Args:
        queries: (n_queries, dim) raw query vectors.
        docs: (n_docs, dim) raw document vectors.
        doc_norms: (n_docs,) stored L2 norms of the raw documents (the rescoring weight).
        k: documents kept per query (fewer if the corpus is smaller).
        alphas: exponents of the document norm; 0 is plain cosine.

    Returns:
        ``{alpha: (indices, scores)}``, each (n_queries, k), best first; equal scores by document index.
    """
    k = min(k, docs.shape[0])
    queries, docs = np.asarray(queries, np.float64), np.asarray(docs, np.float64)
    qn = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-300)
    dn = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), 1e-300)
    weights = {a: np.asarray(doc_norms, np.float64) ** a for a in alphas if a != 0.0}
    out = {a: (np.empty((len(qn), k), np.int64), np.empty((len(qn), k), np.float64)) for a in alphas}
    batch = max(1, BATCH_SCORES // max(1, docs.shape[0]))
    for start in range(0, len(qn), batch):
        cos = qn[start : start + batch] @ dn.T
        for a in alphas:
            idx, sc = out[a]
            idx[start : start + batch], sc[start : start + batch] = _top_rows(
                cos if a == 0.0 else cos * weights[a], k
            )
    return out


def retrieval_rankings(
    sets: list[RetrievalSet], k: int = TOP_K, alphas: tuple[float, ...] = ALPHAS
) -> pl.DataFrame:
    """The ``retrieval_rankings`` rows (probe_set, alpha, query_id, rank, doc_id, score) of every set."""
    frames = []
    for rs in sets:
        if not rs.query_ids or not rs.doc_ids:
            continue
        for alpha, (idx, scores) in exact_topk(rs.queries, rs.docs, rs.doc_norms, k, alphas).items():
            nq, kk = idx.shape
            frames.append(
                pl.DataFrame(
                    {
                        "probe_set": rs.probe_set,
                        "alpha": alpha,
                        "query_id": np.repeat(np.asarray(rs.query_ids, dtype=object), kk),
                        "rank": np.tile(np.arange(1, kk + 1, dtype=np.int32), nq),
                        "doc_id": np.asarray(rs.doc_ids, dtype=object)[idx.reshape(-1)],
                        "score": scores.reshape(-1),
                    },
                    schema=RANKING_SCHEMA,
                )
            )
    return pl.concat(frames) if frames else pl.DataFrame(schema=RANKING_SCHEMA)


def register_retrieval_tables(con: duckdb.DuckDBPyConnection, model: str, release: str) -> int:
    """Search every retrieval set and register ``retrieval_rankings`` and ``retrieval_queries`` on ``con``.

    Returns the number of per-query rows (0 when the release has no retrieval probe set: the retrieval
    analyses then produce no rows).
    """
    rankings = retrieval_rankings(load_retrieval_sets(con, model, release))
    con.register("retrieval_rankings_input", rankings.to_arrow())
    con.execute("create or replace temp table retrieval_rankings as select * from retrieval_rankings_input")
    con.unregister("retrieval_rankings_input")
    # every per-query row is a ranked query's: without rankings, the query's columns alone
    per_query = (run_query if rankings.height else empty_result)(con, "retrieval_per_query", model=model,
                                                                 release=release)
    con.register("retrieval_queries_input", per_query.to_arrow())
    con.execute("create or replace temp table retrieval_queries as select * from retrieval_queries_input")
    con.unregister("retrieval_queries_input")
    return per_query.height
