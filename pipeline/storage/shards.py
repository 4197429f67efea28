"""Splitting probe sets into content-addressed shards, and deciding which are already done.

A shard's id hashes its item ids, the sha256 of each item's exact text (after any template), the
model fingerprint and the embedding parameters, so the same work always gets the same id and a
rerun can skip it, while a text changed under an unchanged id makes new work. Every stored row
carries its ``text_sha256``, and a committed row counts as done only while its (item_id,
text_sha256) is the current item's. Shard boundaries follow the probe set's stable order
(``start`` offsets are multiples of the shard size), so a ``--limit`` run's last shard is a prefix
of the full run's shard and never overlaps another one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import polars as pl
import pyarrow.parquet as pq

from pipeline.probes.base import text_sha256
from pipeline.storage.store import Manifest, PartInfo, Store

# item_id -> text_sha256 of the rows of one part (None: a part written before rows carried the hash)
PartRows = dict[str, str | None]


@dataclass
class Shard:
    """A slice of one probe set to embed as one Parquet part."""

    probe_set: str
    shard_id: str
    start: int
    item_ids: list[str]
    texts: list[str] = field(repr=False)
    text_sha256: list[str] = field(default_factory=list, repr=False)  # of ``texts``, in order

    def __post_init__(self) -> None:
        if not self.text_sha256:
            self.text_sha256 = text_sha256(self.texts)

    @property
    def rows(self) -> PartRows:
        """``item_id -> text_sha256`` of the rows this shard's part must hold."""
        return dict(zip(self.item_ids, self.text_sha256, strict=True))

    @property
    def size(self) -> int:
        return len(self.item_ids)


def shard_id(item_ids: list[str], text_hashes: list[str], fingerprint: str, params: dict) -> str:
    """Content hash of a shard: same items, texts, weights and parameters -> same id."""
    h = hashlib.sha256()
    h.update(fingerprint.encode())
    h.update(json.dumps(params, sort_keys=True).encode())
    for i, t in zip(item_ids, text_hashes, strict=True):
        h.update(b"\x00")
        h.update(i.encode())
        h.update(b"\x01")
        h.update(t.encode())
    return h.hexdigest()[:20]


def split_shards(probe_set: str, items: pl.DataFrame, fingerprint: str, params: dict, size: int) -> list[Shard]:
    """Cut ``items`` (in their stable order) into shards of ``size`` items."""
    ids = items["item_id"].to_list()
    texts = items["text"].to_list()
    hashes = text_sha256(texts)
    out = []
    for start in range(0, len(ids), size):
        chunk, chunk_hashes = ids[start : start + size], hashes[start : start + size]
        out.append(Shard(probe_set, shard_id(chunk, chunk_hashes, fingerprint, params), start, chunk,
                         texts[start : start + size], chunk_hashes))
    return out


def part_rows(source) -> PartRows:
    """``item_id -> text_sha256`` of one part's rows (a path or file object; reads only those columns).

    A part written before rows carried ``text_sha256`` maps every id to None, which matches no item.
    """
    pf = pq.ParquetFile(source)
    names = pf.schema_arrow.names
    table = pf.read(columns=[c for c in ("item_id", "text_sha256") if c in names])
    ids = table["item_id"].to_pylist()
    hashes = table["text_sha256"].to_pylist() if "text_sha256" in names else [None] * len(ids)
    return dict(zip(ids, hashes, strict=True))


def committed_item_ids(store: Store, manifest: Manifest | None) -> dict[str, PartRows]:
    """``item_id -> text_sha256`` of every committed part, by shard id (reads only those two columns)."""
    if manifest is None:
        return {}
    d = store.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)

    def read(rel: str) -> PartRows:
        with store.fs.open(store.path(rel), "rb") as fh:
            return part_rows(fh)

    return {p.shard_id: store.retry(lambda rel=f"{d}/{p.file}": read(rel), f"read {d}/{p.file}")
            for p in manifest.parts}


def pending_shards(shards: list[Shard], committed: dict[str, PartRows]) -> list[Shard]:
    """Shards with an item not committed under its current text: the work a (re)run still has to do.

    A row counts as done only when both its item_id and its text_sha256 are the item's now, so a text
    changed under the same id is embedded again (its shard has a new id) while its neighbours' shards,
    unchanged, are skipped. The rows decide, not the shard ids a manifest lists: a part whose rows carry
    no text hash (written before they did) is never done, whatever its name.
    """
    done = {(i, h) for rows in committed.values() for i, h in rows.items() if h is not None}
    return [s for s in shards if not set(s.rows.items()) <= done]


def merge_part(manifest: Manifest, part: PartInfo, part_ids: PartRows, committed: dict[str, PartRows]) -> list[str]:
    """Add ``part`` to ``manifest``; drop older parts it supersedes. Returns the dropped files.

    An older part is superseded when all its items are in the new part: a ``--limit`` prefix of
    the same shard, or the same items with a changed text (or no text hash yet), whose rows the new
    part replaces, so an item never has two rows. A partial overlap means the probe set's items
    changed under a committed release, which would mix two versions of items: refuse it.
    """
    dropped = []
    keep = []
    for p in manifest.parts:
        if p.shard_id == part.shard_id:
            continue  # the same shard embedded again (e.g. after a failed commit): replaced
        old = set(committed.get(p.shard_id, {}))
        overlap = old & set(part_ids)
        if not overlap:
            keep.append(p)
        elif old <= set(part_ids):
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
