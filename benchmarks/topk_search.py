"""Exact top-10 retrieval by cosine: inside DuckDB (sql/retrieval_topk.sql) vs numpy (pipeline/analysis/retrieval.py).

Both read the same DuckDB tables in one process; the numpy side includes fetching the vectors out of
DuckDB. Prints seconds and the ratio, and checks the two agree on the top-1 document.

    python benchmarks/topk_search.py [--queries 300] [--docs 10000] [--dim 384]
"""

from __future__ import annotations

import argparse
import time

import duckdb
import numpy as np
import pyarrow as pa

from pipeline.analysis.retrieval import exact_topk, load_retrieval_sets
from pipeline.analysis.sql import run_query


def build(con: duckdb.DuckDBPyConnection, n_queries: int, n_docs: int, dim: int) -> None:
    """Register ``embeddings`` and ``probe_items`` tables with one retrieval probe set of random vectors."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(n_queries + n_docs, dim)).astype(np.float32)
    ids = [f"q{i:06d}" for i in range(n_queries)] + [f"d{i:07d}" for i in range(n_docs)]
    flat = pa.array(vectors.reshape(-1))
    embeddings = pa.table(
        {
            "model": ["m"] * len(ids),
            "release": ["r"] * len(ids),
            "probe_set": ["ir"] * len(ids),
            "item_id": ids,
            "norm": np.linalg.norm(vectors, axis=1).astype(np.float64),
            "vector": pa.ListArray.from_arrays(
                pa.array(np.arange(0, len(flat) + 1, dim, dtype=np.int32)), flat
            ),
            "n_tokens": np.full(len(ids), 8, dtype=np.int32),
        }
    )
    items = pa.table(
        {"probe_set": ["ir"] * len(ids), "item_id": ids, "kind": ["query"] * n_queries + ["doc"] * n_docs}
    )
    con.register("embeddings_arrow", embeddings)
    con.register("items_arrow", items)
    con.execute("create table embeddings as select * from embeddings_arrow")
    con.execute("create table probe_items as select * from items_arrow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args()
    con = duckdb.connect()
    build(con, args.queries, args.docs, args.dim)
    print(
        f"{args.queries} queries x {args.docs} documents, dim {args.dim}; "
        f"DuckDB threads {con.execute('select current_setting(' + repr('threads') + ')').fetchall()[0][0]}"
    )

    t0 = time.perf_counter()
    (rs,) = load_retrieval_sets(con, "m", "r")
    idx, _ = exact_topk(rs.queries, rs.docs, rs.doc_norms, k=10)[0.0]
    numpy_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    duck = run_query(con, "retrieval_topk", model="m", release="r", k=10)
    duckdb_s = time.perf_counter() - t0

    top1 = duck.filter(duck["rank"] == 1).sort("query_id")["doc_id"].to_list()
    agree = np.mean([a == rs.doc_ids[b] for a, b in zip(top1, idx[:, 0], strict=True)])
    print(f"numpy matrix product (float64, batched): {numpy_s:8.2f} s")
    print(f"DuckDB list_cosine_similarity + window:  {duckdb_s:8.2f} s")
    print(f"ratio DuckDB / numpy: {duckdb_s / numpy_s:.1f}x   top-1 agreement: {agree:.1%}")


if __name__ == "__main__":
    main()
