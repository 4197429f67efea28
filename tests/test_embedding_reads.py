"""The analyses read a release's embeddings no more often than they must: every read of the ``embeddings`` view
checks each row's text hash against probe_items (~10 s at 10 M items under 256MB, docs/analyses.md). Here the
release's part files are deleted once the catalog is open: what still answers read nothing more of them."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from pipeline.analysis.claims import run_tests
from pipeline.analysis.retrieval import load_retrieval_sets, register_retrieval_tables
from pipeline.analysis.sql import ensure_staged, run_query
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.helpers import store_synthetic, word_probe_set

N = 500


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(48)
    store = Store(str(tmp_path / "root"))
    store_synthetic(store, "m", "r", word_probe_set("p", N, {"zipf": rng.uniform(1, 7, N)}),
                    1 + rng.uniform(0, 1, N), shard_size=100)
    return store


def _delete_parts(store: Store) -> None:
    parts = list(Path(store.root_url.removeprefix("file://")).glob("embeddings/**/*.parquet"))
    assert parts, "no part files found to delete"
    for part in parts:
        part.unlink()


def test_the_release_s_probe_sets_are_read_once_for_the_groups_the_coverage_and_the_claims(store):
    con = open_catalog(store)
    ensure_staged(con, "stg_release_sets", "m", "r")
    _delete_parts(store)
    with pytest.raises(duckdb.IOException):  # the view itself can no longer be read
        con.execute("select count(*) from embeddings").fetchall()
    ensure_staged(con, "stg_analysis_groups", "m", "r")
    assert con.execute("select probe_set, property, set_items from stg_analysis_groups").fetchall() == [
        ("p", "zipf", N)]
    coverage = run_query(con, "claims_coverage", model="m", release="r")
    assert coverage.rows() == [("p", N, N)]
    assert run_tests(con, pl.DataFrame(), "m", "r", seed=0, resamples=10) == []  # no claim's probe set here


def test_the_probe_sets_and_the_analysed_values_share_one_read_of_the_release(store):
    con = open_catalog(store)
    ensure_staged(con, "stg_release_sets", "m", "r")
    _delete_parts(store)
    ensure_staged(con, "stg_analysis_values", "m", "r")  # its steps start from the same staged read
    ensure_staged(con, "stg_analysis_groups", "m", "r")
    zipf = con.execute("select count(*) from stg_analysis_values v join stg_analysis_groups g using (group_key) "
                       "where g.property = 'zipf'").fetchone()[0]
    assert zipf == N
    tables = {r[0] for r in con.execute("select table_name from duckdb_tables() where temporary").fetchall()}
    assert {"stg_release_sets", "stg_analysis_values"} <= tables and "stg_analysis_scope" not in tables


def test_the_shared_read_stays_until_every_table_built_from_it_is_staged(store):
    con = open_catalog(store)
    ensure_staged(con, "stg_analysis_values", "m", "r")
    tables = {r[0] for r in con.execute("select table_name from duckdb_tables() where temporary").fetchall()}
    assert "stg_analysis_scope" in tables and "stg_analysis_positions" not in tables
    _delete_parts(store)
    assert run_query(con, "claims_coverage", model="m", release="r").rows() == [("p", N, N)]
    assert "stg_analysis_scope" not in {r[0] for r in con.execute("select table_name from duckdb_tables()").fetchall()}


def test_a_release_without_queries_and_documents_is_not_read_for_the_retrieval_search(store):
    con = open_catalog(store)
    searched = register_retrieval_tables(con, "m", "r")  # with its files: no rows, the query's own columns
    columns = con.sql("select * from retrieval_queries").pl()
    assert searched == 0 and columns.height == 0 and "ndcg_at_10" in columns.columns
    _delete_parts(store)
    assert load_retrieval_sets(con, "m", "r") == []  # no probe set has both kinds of item: nothing read
