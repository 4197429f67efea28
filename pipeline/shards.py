"""Splitting probe sets into content-addressed shards, and deciding which are already done.

A shard's id hashes its item ids, the model fingerprint and the embedding
parameters, so the same work always gets the same id and a rerun can skip it.
Shard boundaries follow the probe set's stable order (``start`` offsets are
multiples of the shard size), so a ``--limit`` run's last shard is a prefix of
the full run's shard and never overlaps another one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import polars as pl

from pipeline.store import Manifest, PartInfo, Store


@dataclass
class Shard:
    """A slice of one probe set to embed as one Parquet part."""

    probe_set: str
    shard_id: str
    start: int
    item_ids: list[str]
    texts: list[str] = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.item_ids)


def shard_id(item_ids: list[str], fingerprint: str, params: dict) -> str:
    """Content hash of a shard: same items, weights and parameters -> same id."""
    h = hashlib.sha256()
    h.update(fingerprint.encode())
    h.update(json.dumps(params, sort_keys=True).encode())
    for i in item_ids:
        h.update(b"\x00")
        h.update(i.encode())
    return h.hexdigest()[:20]


def split_shards(probe_set: str, items: pl.DataFrame, fingerprint: str, params: dict, size: int) -> list[Shard]:
    """Cut ``items`` (in their stable order) into shards of ``size`` items."""
    ids = items["item_id"].to_list()
    texts = items["text"].to_list()
    out = []
    for start in range(0, len(ids), size):
        chunk = ids[start : start + size]
        out.append(Shard(probe_set, shard_id(chunk, fingerprint, params), start, chunk, texts[start : start + size]))
    return out


def committed_item_ids(store: Store, manifest: Manifest | None) -> dict[str, set[str]]:
    """Item ids of every committed part, by shard id (reads only the item_id column)."""
    if manifest is None:
        return {}
    d = store.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)
    return {
        p.shard_id: set(store.read_table(f"{d}/{p.file}", columns=["item_id"])["item_id"].to_pylist())
        for p in manifest.parts
    }


def pending_shards(shards: list[Shard], committed: dict[str, set[str]]) -> list[Shard]:
    """Shards whose items are not all committed yet: the work a (re)run still has to do."""
    done_ids = set().union(*committed.values()) if committed else set()
    return [s for s in shards if s.shard_id not in committed and not set(s.item_ids) <= done_ids]


def merge_part(manifest: Manifest, part: PartInfo, part_ids: set[str], committed: dict[str, set[str]]) -> list[str]:
    """Add ``part`` to ``manifest``; drop older parts it supersedes. Returns the dropped files.

    An older part is superseded when all its items are in the new part (a ``--limit``
    prefix of the same shard). A partial overlap means the probe set changed under a
    committed release, which would mix two versions of items: refuse it.
    """
    dropped = []
    keep = []
    for p in manifest.parts:
        if p.shard_id == part.shard_id:
            continue  # the same shard embedded again (e.g. after a failed commit): replaced
        old = committed.get(p.shard_id, set())
        overlap = old & part_ids
        if not overlap:
            keep.append(p)
        elif old <= part_ids:
            dropped.append(p.file)
        else:
            raise ValueError(
                f"part {part.file} overlaps committed part {p.file} of {manifest.model}/{manifest.release}/"
                f"{manifest.probe_set} in {len(overlap)} items without containing it: the probe set changed "
                "since that release was embedded. Audit it under a new --release label."
            )
    manifest.parts = sorted([*keep, part], key=lambda p: p.start)
    committed[part.shard_id] = part_ids
    return dropped
