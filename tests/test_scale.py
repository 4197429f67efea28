"""Audits at scale: the reproducible sentence probe set, shard sizes for large sets, commits that do not
re-read the partition, and the vectorised row checks of a part's validation (issue 19)."""

from __future__ import annotations

import io
import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wordfreq import zipf_frequency

from pipeline.probes import load_probe_set
from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.probes.scale import english_words, template_sentences, write_probe_file
from pipeline.probes.templates import TEMPLATES
from pipeline.quality.suites import embeddings_frame, validate_embeddings
from pipeline.storage.parts import commit_part, embeddings_table
from pipeline.storage.shards import (
    MAX_AUTO_SHARD_SIZE,
    MAX_CPU_SHARD_SIZE,
    MIN_AUTO_SHARDS,
    SHARD_SIZE,
    committed_item_ids,
    default_shard_size,
    pending_shards,
    split_shards,
)
from pipeline.storage.store import Manifest, Store
from tests.helpers import FakeResult, store_synthetic, word_probe_set

FP = "f" * 64
PARAMS = {"pooling": "mean"}


# ---------------------------------------------------------------- the probe set
def test_template_sentences_are_reproducible_unique_and_carry_each_words_zipf(tmp_path):
    n = 4 * 25 + 3  # a cut inside one word's templates
    frame = template_sentences(n)
    assert frame.equals(template_sentences(n))
    assert frame.height == n and frame["item_id"].is_unique().all() and frame["text"].is_unique().all()
    assert set(frame["kind"]) == {"sentence"} and set(frame["lang"]) == {"en"}
    words = english_words(26)
    assert words[:3] == ["the", "to", "and"] and all(w.isascii() and w.isalpha() for w in words)
    fills = list(TEMPLATES.items())
    for row_index in (0, 5, n - 1):
        word, (key, template) = words[row_index // 4], fills[row_index % 4]
        row = frame.row(row_index, named=True)
        assert row["item_id"] == f"{key}:{word}" and row["text"] == template.format(word)
        assert row["zipf"] == zipf_frequency(word, "en") > 0
    # the audit reads the written file as a user's probe file: every item gets its word's zipf
    path = str(tmp_path / "wordfreq-sentences.parquet")
    assert write_probe_file(path, n) == n
    ps = load_probe_set(path)
    assert ps.name == "wordfreq-sentences" and ps.items.height == n
    zipf = ps.properties.filter(pl.col("property") == "zipf")
    assert zipf.height == n and zipf["value"].to_list() == frame["zipf"].to_list()


def test_template_sentences_refuse_what_the_word_list_cannot_give(tmp_path):
    with pytest.raises(ProbeInputError, match="at least one item"):
        template_sentences(0)
    with pytest.raises(ProbeInputError, match="ASCII alphabetic English words"):
        english_words(10**7)
    with pytest.raises(ProbeInputError, match=r"must end in \.parquet"):
        write_probe_file(str(tmp_path / "x.csv"), 10)


# ---------------------------------------------------------------- shard sizes
def test_default_shard_size_grows_with_the_set_in_nesting_steps():
    assert default_shard_size(1) == default_shard_size(50_000) == SHARD_SIZE
    assert default_shard_size(100_000) == 8192 and default_shard_size(1_000_000) == 65_536
    # CPU workers stop at 65,536 (their memory grows with the shard), GPU workers go on to 131,072
    assert default_shard_size(5_000_000) == default_shard_size(10**9) == MAX_CPU_SHARD_SIZE == 65_536
    assert default_shard_size(5_000_000, "cuda") == MAX_AUTO_SHARD_SIZE == 131_072
    assert default_shard_size(10**9, "mps") == MAX_AUTO_SHARD_SIZE
    assert default_shard_size(1_000_000, "cuda") == 65_536
    for device in ("cpu", "cuda"):
        for n in (1, 4095, 65_535, 65_536, 262_144, 999_999, 10**7):
            size = default_shard_size(n, device)
            assert size % SHARD_SIZE == 0 and (size // SHARD_SIZE).bit_count() == 1  # 4096 * 2**k: sizes nest
            assert size == SHARD_SIZE or -(-n // size) >= MIN_AUTO_SHARDS  # larger only with enough shards left


def test_a_larger_shard_supersedes_the_smaller_parts_it_covers_and_a_smaller_one_is_done(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 40, {"zipf": np.arange(40)})
    norms = np.linspace(1, 2, 40)
    store_synthetic(store, "m", "r", ps, norms, shard_size=8)  # five parts of 8
    before = store.read_manifest("m", "r", "w")
    # the audit with a larger shard size: committed rows are done whatever the boundaries
    assert pending_shards(split_shards("w", ps.items, FP, PARAMS, 16), committed_item_ids(store, before)) == []
    store_synthetic(store, "m", "r", ps, norms, shard_size=16)  # shards of 16 cover the parts of 8
    after = store.read_manifest("m", "r", "w")
    assert [p.rows for p in after.parts] == [16, 16, 8] and [p.start for p in after.parts] == [0, 16, 32]
    rows = {i: sid for sid, r in committed_item_ids(store, after).items() for i in r}
    assert len(rows) == 40  # one row per item
    assert not any(store.exists(f"{store.embeddings_dir('m', 'r', 'w')}/{p.file}") for p in before.parts[:4])
    assert pending_shards(split_shards("w", ps.items, FP, PARAMS, 8), committed_item_ids(store, after)) == []


# ---------------------------------------------------------------- commits
def _commit(store: Store, ps: ProbeSet, start: int, size: int, seed: int = 0):
    items = ps.items.slice(start, size)
    (shard,) = split_shards(ps.name, items, FP, PARAMS, size)
    shard.start = start
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(size, 4)).astype(np.float32)
    res = FakeResult(vectors, np.linalg.norm(vectors.astype(np.float64), axis=1), np.full(size, 3),
                     np.zeros(size, bool))
    return commit_part(store, shard, embeddings_table("m", "r", shard, res), Manifest("m", "r", ps.name, FP, PARAMS, 4,
                                                                                   "float32"))


def test_a_partial_overlap_is_refused_after_many_commits_and_nothing_changes(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 60, {"zipf": np.arange(60)})
    for start in range(0, 48, 8):
        _commit(store, ps, start, 8)
    before = store.read_manifest("m", "r", "w")
    with pytest.raises(ValueError, match="overlaps committed part .* in 4 items without containing it"):
        _commit(store, ps, 44, 8)  # half of the last part, half new
    assert store.read_manifest("m", "r", "w").parts == before.parts
    assert _commit(store, ps, 48, 8).parts[-1].start == 48  # the index is still right after the refusal


def test_a_commit_by_another_process_is_seen_by_the_next_commit_here(tmp_path):
    """The committing process keeps an index of the partition's items; another writer's manifest (here a
    second Store object standing for another process, which writes the manifest the same way) makes it
    read the parts again, so an overlap with a part it never saw is still refused."""
    root = str(tmp_path / "root")
    ps = word_probe_set("w", 40, {"zipf": np.arange(40)})
    here = Store(root)
    _commit(here, ps, 0, 8)
    other = Store(root)
    manifest = other.read_manifest("m", "r", "w")
    ids = [f"w{i:05d}" for i in range(8, 16)]
    frame = pl.DataFrame({"item_id": ids, "text_sha256": ["0" * 64] * 8})
    buf = io.BytesIO()
    pq.write_table(frame.to_arrow(), buf)
    d = other.embeddings_dir("m", "r", "w")
    other.write_bytes_atomic(f"{d}/part-other.parquet", buf.getvalue())
    from pipeline.storage.store import PartInfo, sha256_bytes

    manifest.parts.append(PartInfo("other", "part-other.parquet", 8, sha256_bytes(buf.getvalue()), 8))
    other.write_manifest(manifest)
    with pytest.raises(ValueError, match="overlaps committed part part-other.parquet"):
        _commit(here, ps, 12, 8)
    assert [p.shard_id for p in here.read_manifest("m", "r", "w").parts][-1] == "other"


# ---------------------------------------------------------------- the vector rules of a part's validation
def _table(vectors, norms, vector_dtype="float32"):
    ps = word_probe_set("w", len(norms), {"zipf": np.arange(len(norms))})
    (shard,) = split_shards("w", ps.items, FP, PARAMS, len(norms))
    res = FakeResult(vectors, norms, np.full(len(norms), 3), np.zeros(len(norms), bool))
    return embeddings_table("m", "r", shard, res, vector_dtype), shard


def _general_path(table: pa.Table, shard):
    """The same frame with vectors of unequal lengths forced through the per-component path."""
    one = table.slice(0, 1)
    ragged = pa.array([[1.0, 2.0]], type=pa.list_(pa.float32()))
    extra = one.set_column(one.schema.get_field_index("vector"), "vector", ragged.cast(pa.list_(pa.float32())))
    cast = table.set_column(table.schema.get_field_index("vector"), "vector",
                            table["vector"].cast(pa.list_(pa.float32())))
    return embeddings_frame(pa.concat_tables([cast, extra]), shard.item_ids, shard.text_sha256).iloc[:-1]


@pytest.mark.parametrize("vector_dtype", ["float32", "float16"])
def test_the_matrix_path_checks_every_row_like_the_general_path(vector_dtype):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(50, 16)).astype(np.float32)
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    vectors[3, 5], vectors[7, 0] = np.nan, np.inf
    norms[9] *= 1.5  # a vector whose length is not its norm
    table, shard = _table(vectors, norms, vector_dtype)
    fast = embeddings_frame(table, shard.item_ids, shard.text_sha256)
    slow = _general_path(table, shard)
    assert fast["vector_finite"].tolist() == slow["vector_finite"].tolist()
    assert [i for i, ok in enumerate(fast["vector_finite"]) if not ok] == [3, 7]
    np.testing.assert_allclose(fast["unit_length"], slow["unit_length"], rtol=1e-12)
    report = validate_embeddings(table, shard.item_ids, 16, vector_dtype, "m", "r", "w", None, shard.text_sha256)
    failed = {f.column: f for f in report.failures}
    assert not report.success and failed["vector_finite"].count == 2 and failed["unit_length"].count == 1
    assert failed["unit_length"].examples == ["w00009"]
    json.dumps(report.result, default=str)
