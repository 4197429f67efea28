"""Storage protocol and catalog: only committed parts are visible; SQL is read-only."""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl
import pytest

from pipeline.names import check_name
from pipeline.settings import Settings
from pipeline.storage.catalog import (
    MemoryBudgetError,
    ReadOnlyError,
    check_read_only,
    connect,
    open_catalog,
    run_read_only,
    within_memory,
)
from pipeline.storage.parts import embeddings_table, encode_table, write_part
from pipeline.storage.shards import split_shards
from pipeline.storage.store import StorageError, Store
from tests.helpers import FakeResult, store_synthetic, word_probe_set


def _ps(n=30):
    return word_probe_set("words", n, {"zipf": np.linspace(1, 6, n)})


def test_committed_parts_visible_with_fixed_size_vectors(tmp_path):
    store = Store(str(tmp_path / "root"))
    norms = np.linspace(0.5, 3.0, 30)
    store_synthetic(store, "m", "r", _ps(), norms, dim=4, shard_size=8)
    con = open_catalog(store)
    assert con.execute("select count(*) from embeddings").fetchall()[0][0] == 30
    # vectors cast to a fixed-size DuckDB array and their L2 norm equals the stored norm
    got = con.sql(
        "select norm, sqrt(list_sum(list_transform(vector::FLOAT[4]::FLOAT[], lambda x: x * x))) "
        "from embeddings order by item_id"
    ).fetchall()
    assert np.allclose([g[0] for g in got], norms) and np.allclose([g[1] for g in got], norms, rtol=1e-6)
    m = store.read_manifest("m", "r", "words")
    assert len(m.parts) == 4 and sum(p.rows for p in m.parts) == 30
    # polars reads the same part as a fixed-size Array
    part = store.path(store.embeddings_dir("m", "r", "words"), m.parts[0].file)
    assert isinstance(pl.read_parquet(part).schema["vector"], pl.Array)


def test_catalog_connection_keeps_freed_memory_up_to_its_limit(tmp_path):
    # the analyses' speed at millions of items depends on it (benchmarks/analysis_suite.py); a plain
    # connection keeps none
    def setting(con, name):
        return con.execute(f"select value from duckdb_settings() where name = '{name}'").fetchone()[0]

    def gib(text):  # DuckDB reports sizes as "18.7 GiB", "512.0 MiB", "0 bytes"
        number, unit = text.split()
        return float(number) * {"bytes": 2**-30, "KiB": 2**-20, "MiB": 2**-10, "GiB": 1, "TiB": 2**10}[unit]

    assert gib(setting(duckdb.connect(), "block_allocator_memory")) == 0
    for con in (connect(), open_catalog(Store(str(tmp_path / "root")))):
        kept, limit = gib(setting(con, "block_allocator_memory")), gib(setting(con, "memory_limit"))
        # the limit, up to DuckDB's rounding of what it reports (18.8 GiB set reads back as 18.7 GiB)
        assert limit > 0 and abs(kept - limit) <= 0.01 * limit
        assert con.execute("select sum(range) from range(1000000)").fetchone()[0] == 499999500000
        con.close()


def test_a_memory_limit_bounds_duckdb_which_spills_past_it_and_a_bad_one_is_named(tmp_path):
    """The audit's analyses hold DuckDB to NORMAUDIT_ANALYSIS_MEMORY: a sort larger than the limit still finishes
    (spilled to a temporary folder, not the working directory), and its freed memory is kept up to the limit."""
    con = open_catalog(Store(str(tmp_path / "root")), memory_limit="64MB")
    limits = con.execute("select current_setting('memory_limit'), current_setting('block_allocator_memory'), "
                         "current_setting('temp_directory')").fetchall()[0]
    assert limits[0] == limits[1] == "61.0 MiB" and "normaudit-sql-" in limits[2], limits  # 64 MB = 61.0 MiB
    rows = con.execute("select count(*), count(distinct k) from (select hash(range) as k, range::varchar as s "
                       "from range(3000000) order by s)").fetchall()  # ~150 MB of sort: more than the limit
    assert rows == [(3000000, 3000000)]
    con.close()
    for bad in ("lots", "512", "1GB; drop table x"):
        with pytest.raises(ValueError, match=f"memory limit '{bad}': give a size such as 512MB"):
            connect(memory_limit=bad)
    with pytest.raises(ValueError, match="analysis_memory"):
        Settings(analysis_memory="lots")


def test_duckdb_out_of_memory_in_a_step_is_said_as_the_setting_to_raise(tmp_path):
    """What DuckDB cannot spill (one list of 2 M numbers) under a step's budget raises MemoryBudgetError naming the
    setting and its value, chained to DuckDB's error; other DuckDB errors pass through unchanged."""
    con = connect(memory_limit="4MB")
    said = r"^the report needed more than NORMAUDIT_ANALYSIS_MEMORY=4MB of DuckDB memory, even spilling to disk \(Out"
    with pytest.raises(MemoryBudgetError, match=said) as err, within_memory("4MB", "the report"):
        con.execute("select list(range) from range(2000000)").fetchall()
    assert isinstance(err.value.__cause__, duckdb.OutOfMemoryException) and "set NORMAUDIT_ANALYSIS_MEMORY higher" \
        in str(err.value)
    with pytest.raises(duckdb.ParserException), within_memory("4MB", "the report"):
        con.execute("selec 1").fetchall()
    con.close()


def test_written_but_uncommitted_part_is_invisible(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = _ps(10)
    shard = split_shards("words", ps.items, "f" * 64, {}, 10)[0]
    res = FakeResult(np.ones((10, 4), np.float32), np.full(10, 2.0), np.full(10, 3), np.zeros(10, bool))
    info = write_part(store, "m", "r", shard, encode_table(embeddings_table("m", "r", shard, res)), 10)
    assert store.exists(f"{store.embeddings_dir('m', 'r', 'words')}/{info.file}")  # in its final place
    assert open_catalog(store).execute("select count(*) from embeddings").fetchall()[0][0] == 0


def test_limit_prefix_is_superseded_not_duplicated(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = _ps(30)
    norms = np.linspace(1, 2, 30)
    store_synthetic(store, "m", "r", ps.head(5), norms[:5], shard_size=8)  # a --limit 5 run
    store_synthetic(store, "m", "r", ps, norms, shard_size=8)  # then the full run
    con = open_catalog(store)
    assert con.execute("select count(*), count(distinct item_id) from embeddings").fetchall()[0] == (30, 30)
    files = store.glob("embeddings/*/*/*/part-*.parquet")
    assert len(files) == 4, files  # the 5-item prefix part was removed after the manifest dropped it


def test_empty_root_has_typed_empty_views(tmp_path):
    con = open_catalog(Store(str(tmp_path / "nothing")))
    for view in ("embeddings", "probe_items", "probe_properties", "token_norms", "runs", "results"):
        assert con.execute(f"select count(*) from {view}").fetchall()[0][0] == 0
    assert dict(con.execute("describe embeddings").fetchall() and
                [(r[0], r[1]) for r in con.execute("describe embeddings").fetchall()])["norm"] == "DOUBLE"


@pytest.mark.parametrize("query", [
    "delete from embeddings",
    "create table x as select 1",
    "copy (select 1) to 'out.csv'",
    "attach 'other.db'",
    "insert into results select * from results",
    "set threads = 1",
    "select 1; drop view embeddings",
])
def test_sql_refuses_writes(tmp_path, query):
    store = Store(str(tmp_path / "root"))
    with pytest.raises(ReadOnlyError, match="read-only"):
        run_read_only(store, query)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "other.db").exists()


def test_select_is_allowed():
    con = duckdb.connect()
    check_read_only(con, "select 42")
    check_read_only(con, "with a as (select 1 as x) select * from a")


@pytest.mark.parametrize("bad", ["..", "a/b", "../etc", "", "x" * 200, "a=b", ".hidden"])
def test_names_that_would_escape_paths_are_refused(bad):
    with pytest.raises(ValueError, match="invalid"):
        check_name(bad, "release label")


def test_unwritable_root_fails_before_work(tmp_path):
    locked = tmp_path / "locked"
    locked.write_text("a file where a folder should be")
    with pytest.raises(StorageError, match="cannot write to storage root"):
        Store(str(locked / "root")).check_writable()


def test_s3_root_gives_same_rows_as_local(tmp_path, s3_env):
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    norms = np.linspace(0.5, 3.0, 30)
    local = Store(str(tmp_path / "root"))
    s3 = open_store(load_settings(root=s3_env))
    assert not s3.is_local
    for store in (local, s3):
        store.check_writable()
        store_synthetic(store, "m", "r", _ps(), norms, shard_size=8)
    q = "select item_id, norm, vector from embeddings order by item_id"
    assert open_catalog(local).execute(q).fetchall() == open_catalog(s3).execute(q).fetchall()
