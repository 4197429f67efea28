"""Embedding parts: build one shard's Parquet table, stage it, check it, commit or quarantine it."""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from pipeline.probes.base import text_sha256
from pipeline.storage.shards import CommitIndex, Shard, merge_part, part_rows
from pipeline.storage.store import Manifest, PartInfo, StorageError, Store, sha256_bytes


@dataclass
class StagedPart:
    """A shard's part written to staging, waiting for validation and commit."""

    model: str
    release: str
    probe_set: str
    shard_id: str
    start: int
    staged: str  # path relative to the root
    rows: int
    sha256: str


# The commit indexes of the partitions this process committed to lately (by folder URL): an audit commits
# to one partition per probe set, and a long-lived process (normaudit serve) must not keep them all.
_INDEXES: OrderedDict[str, CommitIndex] = OrderedDict()
_INDEXES_KEPT = 4
_INDEXES_LOCK = threading.Lock()


def _commit_index(url: str) -> CommitIndex:
    with _INDEXES_LOCK:
        index = _INDEXES.pop(url, None) or CommitIndex()
        _INDEXES[url] = index
        while len(_INDEXES) > _INDEXES_KEPT:
            _INDEXES.popitem(last=False)
        return index


class PartValidationError(ValueError):
    """A staged part failed its checks; it was quarantined and nothing of it is visible."""


def embeddings_table(model: str, release: str, shard: Shard, result, vector_dtype: str = "float32") -> pa.Table:
    """The rows of one shard, in the columns of DESIGN.md's ``embeddings`` table.

    The norm comes from the embedder (computed in float32 or wider before any downcast);
    only the stored vector is cast to ``vector_dtype``. ``text_sha256`` is hashed here from the
    texts the shard handed to the embedder, not copied from the plan, so the row says what was embedded.
    """
    vectors = np.ascontiguousarray(result.vectors, dtype=np.float16 if vector_dtype == "float16" else np.float32)
    n, dim = vectors.shape
    value_type = pa.float16() if vector_dtype == "float16" else pa.float32()
    flat = pa.array(vectors.reshape(-1), type=value_type)
    return pa.table(
        {
            "model": pa.array([model] * n, pa.string()),
            "release": pa.array([release] * n, pa.string()),
            "probe_set": pa.array([shard.probe_set] * n, pa.string()),
            "item_id": pa.array(shard.item_ids, pa.string()),
            "text_sha256": pa.array(text_sha256(shard.texts), pa.string()),
            "norm": pa.array(np.asarray(result.norms, dtype=np.float64)),
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
            "n_tokens": pa.array(np.asarray(result.n_tokens, dtype=np.int32)),
            "truncated": pa.array(np.asarray(result.truncated, dtype=bool)),
        }
    )


def stage_part(store: Store, run_id: str, model: str, release: str, shard: Shard, table: pa.Table) -> StagedPart:
    """Write a shard's table to the run's staging area (invisible to readers)."""
    rel = f"staging/{run_id}/{shard.probe_set}/part-{shard.shard_id}.parquet"
    rows, digest = store.write_table(rel, table)
    return StagedPart(model, release, shard.probe_set, shard.shard_id, shard.start, rel, rows, digest)


def quarantine_part(store: Store, run_id: str, part: StagedPart, report: dict) -> str:
    """Move a failed part and its validation report to ``quarantine/``; returns the folder."""
    folder = f"quarantine/{run_id}/{part.probe_set}"
    store.move(part.staged, f"{folder}/part-{part.shard_id}.parquet")
    store.write_bytes_atomic(f"{folder}/part-{part.shard_id}.report.json", json.dumps(report, indent=1).encode())
    return folder


def commit_part(store: Store, part: StagedPart, template: Manifest) -> Manifest:
    """Move a validated part into its partition and rewrite the manifest (written last).

    ``template`` carries the partition's model, fingerprint, params, dim and dtype; the
    manifest on storage is re-read so that parts committed earlier are kept.
    """
    d = store.embeddings_dir(part.model, part.release, part.probe_set)
    manifest = store.read_manifest(part.model, part.release, part.probe_set)
    if manifest is None:
        manifest = Manifest(**{**asdict(template), "parts": []})
    elif manifest.fingerprint != template.fingerprint:
        raise ValueError(
            f"{d} already holds weights with fingerprint {manifest.fingerprint[:12]}…, not "
            f"{template.fingerprint[:12]}…: a release label names one set of weights. Use a new --release."
        )
    index = _commit_index(store.url(d))
    owners = index.owners_for(store, manifest)
    file = f"part-{part.shard_id}.parquet"
    store.move(part.staged, f"{d}/{file}")
    # read back after the move: the manifest must record the bytes readers will find (a retried
    # move on S3 could otherwise leave an older file in place)
    data = store.read_bytes(f"{d}/{file}")
    if sha256_bytes(data) != part.sha256:
        raise StorageError(f"{store.url(d, file)} does not hold the validated bytes after the move from "
                           f"{part.staged}; nothing was committed. Rerun the audit.")
    ids = part_rows(io.BytesIO(data))
    info = PartInfo(part.shard_id, file, part.rows, part.sha256, part.start, size=len(data))
    index.parts = None  # the owners change below: trusted again only once the new manifest is written
    dropped = merge_part(manifest, info, ids, owners)
    store.write_manifest(manifest)
    index.committed(manifest)
    for f in dropped:  # only after the manifest no longer lists them
        store.rm(f"{d}/{f}")
    return manifest
