"""Embedding parts: build one shard's Parquet table, write it under its final name, commit parts in batches.

A worker writes each validated part straight to its final, content-addressed name in the partition folder
(``part-<shard id>-<first 16 hex of its sha256>.parquet``); nothing reads it until a manifest lists it. The
flow then adds finished parts to the manifest in batches (:func:`commit_parts`), one atomic manifest write per
batch. A part written but never listed (its run was killed in between) is an *orphan*: invisible, reported by
``normaudit verify``, reused by the next audit of its release when its bytes still match its name, or removed.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.probes.base import text_sha256
from pipeline.storage.shards import Shard, committed_item_ids, superseded_parts
from pipeline.storage.store import MANIFEST, Manifest, PartInfo, Store, sha256_bytes

# part-<shard id (20 hex)>-<sha256 prefix (16 hex)>.parquet; parts committed before the names carried the
# sha256 are part-<shard id>.parquet and stay valid (a manifest records every file's name)
PART_NAME = re.compile(r"^part-(?P<shard>[0-9a-f]{20})(?:-(?P<sha>[0-9a-f]{16}))?\.parquet$")
PER_PART_COLUMNS = ("model", "release", "probe_set")  # one value in every row of a part


class PartValidationError(ValueError):
    """A part failed its checks; it was quarantined and nothing of it is visible."""


@dataclass
class WrittenPart:
    """A shard's part written under its final name by a worker, waiting for the flow to commit it."""

    info: PartInfo
    probe_set: str
    supersedes: tuple[str, ...] = ()  # shard ids of committed parts it replaces
    reused: bool = False  # an orphan of an earlier run, checked and reused instead of embedded


def part_name(shard_id: str, sha256: str) -> str:
    """The final name of a part: its shard id and the start of its bytes' sha256."""
    return f"part-{shard_id}-{sha256[:16]}.parquet"


def encode_table(table: pa.Table) -> bytes:
    """A part's table as the Parquet bytes the store keeps (zstd; dictionary pages for the one-value columns only).

    Every other column holds one value per row (item ids, text hashes, vectors, norms): Parquet's dictionary
    would be built and then dropped for them; encoding a 131,072-item part with it peaked 73-99 MiB above where
    it started, without it 23 MiB, and took 0.27 s instead of 0.15 (docs/benchmarks.md).
    """
    buf = io.BytesIO()
    dictionary = [c for c in PER_PART_COLUMNS if c in table.column_names]
    pq.write_table(table, buf, compression="zstd", use_dictionary=dictionary)
    return buf.getvalue()


def embeddings_table(model: str, release: str, shard: Shard, result, vector_dtype: str = "float32") -> pa.Table:
    """The rows of one shard, in the columns of the ``embeddings`` table (docs/design.md).

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


def write_part(store: Store, model: str, release: str, shard: Shard, data: bytes, rows: int) -> PartInfo:
    """Write a validated part's bytes under its final name in the partition folder (invisible until committed)."""
    digest = sha256_bytes(data)
    file = part_name(shard.shard_id, digest)
    store.write_bytes_atomic(f"{store.embeddings_dir(model, release, shard.probe_set)}/{file}", data)
    return PartInfo(shard.shard_id, file, rows, digest, shard.start, size=len(data))


def read_orphan(store: Store, model: str, release: str, probe_set: str, file: str) -> tuple[bytes, PartInfo] | None:
    """An orphan part's bytes and the :class:`PartInfo` it would commit as, or None when its bytes do not
    match the sha256 its name carries (a torn or changed file: it is removed and the shard embedded again)."""
    m = PART_NAME.match(file)
    rel = f"{store.embeddings_dir(model, release, probe_set)}/{file}"
    try:
        data = store.read_bytes(rel)
    except FileNotFoundError:
        return None
    digest = sha256_bytes(data)
    if m is None or m.group("sha") is None or not digest.startswith(m.group("sha")):
        store.rm(rel)
        return None
    rows = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
    return data, PartInfo(m.group("shard"), file, rows, digest, 0, size=len(data))


def quarantine_table(store: Store, run_id: str, probe_set: str, shard_id: str, data: bytes, report: dict) -> str:
    """Write a part that failed its checks, and its validation report, to ``quarantine/``; returns the folder."""
    folder = f"quarantine/{run_id}/{probe_set}"
    store.write_bytes_atomic(f"{folder}/part-{shard_id}.parquet", data)
    store.write_bytes_atomic(f"{folder}/part-{shard_id}.report.json", json.dumps(report, indent=1).encode())
    return folder


def commit_parts(store: Store, template: Manifest, parts: list[WrittenPart]) -> Manifest:
    """Add written parts to their partition's manifest in one atomic write; drop the parts they supersede.

    ``template`` carries the partition's model, release, probe set, fingerprint, params, dim and dtype; the
    manifest on storage is re-read, so parts committed earlier are kept. Files of superseded parts are removed
    only after the new manifest no longer lists them. The caller holds the release's lease (checked just
    before, :func:`pipeline.storage.lease.check`).
    """
    d = store.embeddings_dir(template.model, template.release, template.probe_set)
    manifest = store.read_manifest(template.model, template.release, template.probe_set)
    if manifest is None:
        manifest = Manifest(**{**asdict(template), "parts": []})
    elif manifest.fingerprint != template.fingerprint:
        raise ValueError(
            f"{d} already holds weights with fingerprint {manifest.fingerprint[:12]}…, not "
            f"{template.fingerprint[:12]}…: a release label names one set of weights. Use a new --release."
        )
    # the same shard written again (e.g. after a failed commit) has the same items: its old entry is replaced
    gone = {s for p in parts for s in (p.info.shard_id, *p.supersedes)}
    replaced = {p.file for p in manifest.parts if p.shard_id in gone}
    kept = [p for p in manifest.parts if p.shard_id not in gone]
    manifest.parts = sorted([*kept, *(p.info for p in parts)], key=lambda p: p.start)
    dropped = replaced - {p.file for p in manifest.parts}
    store.write_manifest(manifest)
    for f in sorted(dropped):  # only after the manifest no longer lists them
        store.rm(f"{d}/{f}")
    return manifest


def commit_part(store: Store, shard: Shard, table: pa.Table, template: Manifest) -> Manifest:
    """Write one part and commit it at once: the whole protocol for callers outside an audit (tests, tools).

    The superseded parts are found by reading the committed parts' item ids (an audit plans them once instead).
    """
    manifest = store.read_manifest(template.model, template.release, template.probe_set)
    supersedes = superseded_parts([shard], committed_item_ids(store, manifest), manifest)[shard.shard_id]
    data = encode_table(table)
    info = write_part(store, template.model, template.release, shard, data, table.num_rows)
    return commit_parts(store, template, [WrittenPart(info, shard.probe_set, supersedes)])


def orphans(store: Store, manifest: Manifest) -> list[str]:
    """Part files in a partition's folder that its manifest does not list (written, never committed)."""
    d = store.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)
    listed = {p.file for p in manifest.parts}
    return [rel.rsplit("/", 1)[-1] for rel in store.glob(f"{d}/part-*.parquet")
            if rel.rsplit("/", 1)[-1] not in listed]


__all__ = ["MANIFEST", "PART_NAME", "PartValidationError", "WrittenPart", "commit_part", "commit_parts",
           "embeddings_table", "encode_table", "orphans", "part_name", "quarantine_table", "read_orphan",
           "write_part"]
