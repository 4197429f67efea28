"""GX suites on real frames, the quarantine gate, and Data Docs next to the data (local and S3)."""

from __future__ import annotations

import datetime as dt
import json
import os

import great_expectations as gx
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from pipeline.probes.base import KINDS
from pipeline.quality import suites as validate
from pipeline.quality.datadocs import build_data_docs, data_docs_path
from pipeline.quality.gates import gate_part, gate_probe_set, gate_token_norms
from pipeline.quality.gx_adapter import GXLayoutError, check_rendered, place_validation_result
from pipeline.quality.suites import DataValidationError, suite_name, validate_embeddings, validate_token_norms
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.parts import PartValidationError, embeddings_table, encode_table
from pipeline.storage.shards import split_shards
from pipeline.storage.store import Manifest, Store, open_store
from tests.helpers import FakeResult, word_probe_set

DIM = 8


def _part(n=12, seed=0, dtype="float32", ids=None):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, DIM)).astype(np.float32)
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    ids = ids or [f"w{i:05d}" for i in range(n)]
    return vectors, norms, ids


def _table(vectors, norms, ids, dtype="float32", n_tokens=None):
    shard = split_shards("words", pl.DataFrame({"item_id": ids, "text": ids}), "f" * 64, {}, len(ids))[0]
    res = FakeResult(vectors, norms, np.full(len(ids), 3) if n_tokens is None else n_tokens,
                     np.zeros(len(ids), bool))
    return shard, embeddings_table("m", "r", shard, res, dtype)


def _failed(report):
    return {(f.expectation, f.column): f for f in report.failures}


def test_clean_part_passes_and_suite_is_versioned():
    v, n, ids = _part()
    _, t = _table(v, n, ids)
    report = validate_embeddings(t, ids, DIM, "float32", "m", "r", "words")
    assert report.success and report.failures == [] and report.rows == 12
    assert report.suite == suite_name("embeddings") == f"embeddings.v{validate.SUITE_VERSION}"
    assert report.result["meta"]["normaudit"]["suite_version"] == validate.SUITE_VERSION


def test_each_embeddings_rule_names_its_rows():
    v, n, ids = _part()
    v[1, 3], n[1] = np.nan, np.nan  # NaN vector and norm
    n[2] = np.inf  # infinite norm
    v[4], n[4] = 0.0, 0.0  # zero vector
    n[6] *= 1.01  # vector / norm is not unit length
    n_tokens = np.full(12, 3)
    n_tokens[8] = 0
    _, t = _table(v, n, ids, n_tokens=n_tokens)
    report = validate_embeddings(t, ids, DIM, "float32", "m", "r", "words")
    got = _failed(report)
    assert not report.success
    assert got[("expect_column_values_to_not_be_null", "norm")].examples == ["w00001"]
    assert set(got[("expect_column_values_to_be_between", "norm")].examples) == {"w00002", "w00004"}
    assert got[("expect_column_values_to_be_in_set", "vector_finite")].examples == ["w00001"]
    assert "w00006" in got[("expect_column_values_to_be_between", "unit_length")].examples
    assert got[("expect_column_values_to_be_between", "n_tokens")].examples == ["w00008"]
    # the one-line summary names expectation, count and ids
    assert "expect_column_values_to_not_be_null(norm) failed for 1 rows, e.g. ids ['w00001']" in report.summary(10)


def test_ids_dimension_and_constant_norms():
    v, n, ids = _part()
    _, t = _table(v, n, ids)
    shifted = ids[1:] + ["stranger"]
    report = validate_embeddings(t, shifted, DIM + 1, "float32", "m", "r", "words")
    got = _failed(report)
    assert got[("expect_column_values_to_be_in_set", "in_shard")].examples == ["w00000"]
    assert got[("shard item ids present", "item_id")].examples == ["stranger"]
    assert got[("expect_column_values_to_be_between", "vector_length")].count == 12
    same = np.ones_like(n) * 2.0
    _, t = _table(v / np.linalg.norm(v, axis=1, keepdims=True) * 2.0, same, ids)
    report = validate_embeddings(t, ids, DIM, "float32", "m", "r", "words")
    assert [f.expectation for f in report.failures] == ["expect_column_unique_value_count_to_be_between"]
    # a one-item shard cannot vary, and is fine
    _, t = _table(v[:1], n[:1], ids[:1])
    assert validate_embeddings(t, ids[:1], DIM, "float32", "m", "r", "words").success


def test_duplicate_rows_and_wrong_partition_fail():
    v, n, ids = _part()
    _, t = _table(v, n, ids[:11] + [ids[0]])
    report = validate_embeddings(t, ids, DIM, "float32", "m", "r2", "words")
    got = _failed(report)
    assert got[("expect_column_values_to_be_unique", "item_id")].count == 2
    assert got[("expect_column_values_to_be_in_set", "release")].count == 12


def test_rows_in_another_order_pass_and_a_hash_of_another_item_is_named():
    v, n, ids = _part()
    shard, t = _table(v, n, ids)
    # the shard's rows in reverse: not aligned with the shard, so every id and hash is looked up
    backwards = t.take(list(range(11, -1, -1)))
    assert validate_embeddings(backwards, ids, DIM, "float32", "m", "r", "words", None, shard.text_sha256).success
    # rows 2 and 5 carry each other's text hash: each hash is a planned one, but not its own item's
    hashes = t["text_sha256"].to_pylist()
    hashes[2], hashes[5] = hashes[5], hashes[2]
    swapped = t.set_column(t.column_names.index("text_sha256"), "text_sha256", pa.array(hashes, pa.string()))
    for table in (swapped, swapped.take(list(range(11, -1, -1)))):
        report = validate_embeddings(table, ids, DIM, "float32", "m", "r", "words", None, shard.text_sha256)
        assert sorted(_failed(report)[("expect_column_values_to_be_in_set", "text_is_shards")].examples) == [
            "w00002", "w00005"]
        assert [f.column for f in report.failures] == ["text_is_shards"]


def test_float16_vectors_get_a_looser_tolerance():
    rng = np.random.default_rng(1)
    v = (rng.normal(size=(64, DIM)) * 100).astype(np.float32)
    n = np.linalg.norm(v.astype(np.float64), axis=1)  # the norm is taken before the downcast
    ids = [f"w{i:05d}" for i in range(64)]
    _, t16 = _table(v, n, ids, dtype="float16")
    assert validate_embeddings(t16, ids, DIM, "float16", "m", "r", "words").success
    err = np.abs(np.linalg.norm(t16["vector"].combine_chunks().flatten().to_numpy().astype(np.float64)
                                .reshape(64, DIM), axis=1) / n - 1)
    assert err.max() > validate.UNIT_TOLERANCE["float32"] / 100  # float16 rounding is visible...
    assert err.max() < validate.UNIT_TOLERANCE["float16"]  # ...and inside its tolerance
    n2 = n.copy()
    n2[5] *= 1.01
    _, t16 = _table(v, n2, ids, dtype="float16")
    report = validate_embeddings(t16, ids, DIM, "float16", "m", "r", "words")
    assert _failed(report)[("expect_column_values_to_be_between", "unit_length")].examples == ["w00005"]


def test_token_norms_suite():
    t = pa.table({"model": ["m"] * 4, "release": ["r"] * 4, "token_id": pa.array([0, 1, 2, 2], pa.int64()),
                  "token": ["[PAD]", "a", "b", "c"], "norm": [0.0, 1.0, float("nan"), 2.0]})
    report = validate_token_norms(t, "m", "r")
    got = _failed(report)
    assert got[("expect_column_values_to_be_unique", "token_id")].examples == [2, 2]
    assert got[("expect_column_values_to_not_be_null", "norm")].examples == [2]
    good = t.slice(0, 2)
    assert validate_token_norms(good, "m", "r").success  # a zero padding row is allowed


def test_probe_set_gate_refuses_bad_properties(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("words", 5, {"zipf": np.linspace(1, 5, 5), "bad name": np.ones(5)})
    with pytest.raises(DataValidationError, match=r"probe_properties\.v\d.*match_regex\(property\).*5 rows"):
        gate_probe_set(store, ps, KINDS)
    assert store.glob("**") == []  # nothing written
    ok = word_probe_set("words", 5, {"zipf": np.linspace(1, 5, 5)})
    gate_probe_set(store, ok, KINDS, run_id="run-1")
    assert store.exists("reports/validation/run-1/probe_items/words.json")


def _encoded(ids, vectors, norms):
    shard, table = _table(vectors, norms, ids)
    template = Manifest("m", "r", "words", "f" * 64, {}, DIM, "float32")
    return shard, table, encode_table(table), template


@pytest.mark.parametrize("remote", [False, True])
def test_failed_part_is_quarantined_with_its_result_and_docs_are_built(tmp_path, remote, request):
    if remote:
        store = open_store(load_settings(root=request.getfixturevalue("s3_env")))
    else:
        store = Store(str(tmp_path / "root"))
    v, n, ids = _part()
    n[3] = np.nan
    shard, table, data, template = _encoded(ids, v, n)
    with pytest.raises(PartValidationError) as err:
        gate_part(store, table, data, shard, template, "run-1")
    msg = str(err.value)
    assert "expect_column_values_to_not_be_null(norm) failed for 1 rows" in msg and "'w00003'" in msg
    assert "quarantine/run-1/words" in msg
    q = f"quarantine/run-1/words/part-{shard.shard_id}"
    assert store.read_bytes(f"{q}.parquet") == data  # the bytes that failed, and nothing in the partition
    assert not store.glob("embeddings/**/*.parquet")
    record = json.loads(store.read_bytes(f"{q}.report.json"))
    assert record["success"] is False and record["validation_result"]["success"] is False
    assert open_catalog(store).execute("select count(*) from embeddings").fetchall() == [(0,)]
    url = build_data_docs(store, "run-1")
    assert url == data_docs_path(store, "run-1") and url.endswith("reports/data_docs/run-1/index.html")
    index = store.read_bytes("reports/data_docs/run-1/index.html").decode()
    assert f"embeddings__words__part-{shard.shard_id}" in index and "Failed" in index
    pages = store.glob("reports/data_docs/run-1/validations/**/*.html")
    assert len(pages) == 1
    assert build_data_docs(store, "no-such-run") is None


def test_token_norms_gate_quarantines(tmp_path):
    store = Store(str(tmp_path / "root"))
    t = pa.table({"model": ["m"] * 2, "release": ["r"] * 2, "token_id": pa.array([0, 1], pa.int64()),
                  "token": ["a", "b"], "norm": [1.0, float("inf")]})
    with pytest.raises(DataValidationError, match=r"token norms of m @ r failed token_norms\.v\d"):
        gate_token_norms(store, t, "m", "r", "run-2")
    assert store.exists("quarantine/run-2/token_norms/m/r/part-0.parquet")
    assert not store.glob("token_norms/**")


def test_gx_reads_results_placed_by_the_adapter(tmp_path):
    """Pins the one undocumented GX detail we use: fails when GX stops reading results where the adapter puts them."""
    t = pa.table({"model": ["m"], "release": ["r"], "token_id": pa.array([0], pa.int64()), "token": ["a"],
                  "norm": [1.0]})
    result = validate_token_norms(t, "m", "r").result
    context = gx.get_context(mode="file", project_root_dir=str(tmp_path))
    placed = place_validation_result(str(tmp_path), result, "run-9", dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
                                     "token_norms__m")
    assert placed.startswith(str(tmp_path / "gx" / "uncommitted" / "validations"))
    (index_url,) = context.build_data_docs().values()
    site = os.path.dirname(index_url.removeprefix("file://"))
    check_rendered(site, 1)  # raises GXLayoutError if GX rendered no page for the placed result
    page = os.path.join(site, "validations", *suite_name("token_norms").split("."), "run-9",
                        "20240102T000000.000000Z", "token_norms__m.html")
    assert os.path.exists(page), f"GX {gx.__version__} moved its validation pages: see pipeline/quality/gx_adapter.py"
    with open(os.path.join(site, "index.html")) as fh:
        assert "token_norms__m" in fh.read()
    with pytest.raises(GXLayoutError, match="rendered 1 validation page"):
        check_rendered(site, 2)
    with pytest.raises(ValueError, match="one non-empty path segment"):
        place_validation_result(str(tmp_path), result, "run-9", dt.datetime.now(dt.UTC), "a/b")
