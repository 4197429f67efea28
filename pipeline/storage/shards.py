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

import polars as pl
import pyarrow.parquet as pq

from pipeline.probes.base import text_sha256 as hash_texts  # Shard's argument of that name would shadow it
from pipeline.storage.store import Manifest, PartInfo, Store

SHARD_SIZE = 4096  # items per shard of a small set (settings.shard_size, when given, decides)
MIN_AUTO_SHARDS = 8  # a set gets larger shards only while it still makes at least this many
MAX_AUTO_SHARD_SIZE = 32768
# item_id -> text_sha256 of the rows of one part (None: a part written before rows carried the hash)
PartRows = dict[str, str | None]


class Shard:
    """A slice of one probe set to embed as one Parquet part.

    A plain class, not a dataclass: Prefect and Dask walk the fields of a dataclass argument, and every list in
    it, looking for futures, for every task they run, in the flow process and again on the worker. A shard
    holds three lists of up to 32,768 strings, and on two cores that walking is CPU taken from the model.
    """

    __slots__ = ("probe_set", "shard_id", "start", "item_ids", "texts", "text_sha256")

    def __init__(self, probe_set: str, shard_id: str, start: int, item_ids: list[str], texts: list[str],
                 text_sha256: list[str] | None = None) -> None:
        self.probe_set = probe_set
        self.shard_id = shard_id
        self.start = start
        self.item_ids = item_ids
        self.texts = texts
        self.text_sha256 = text_sha256 or hash_texts(texts)  # of ``texts``, in order

    def __repr__(self) -> str:
        return (f"Shard(probe_set={self.probe_set!r}, shard_id={self.shard_id!r}, start={self.start}, "
                f"items={self.size})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shard):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # mutable, as the dataclass it replaces

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


def default_shard_size(n_items: int) -> int:
    """Items per shard when the settings give none: :data:`SHARD_SIZE`, doubled while the set still makes
    at least :data:`MIN_AUTO_SHARDS` shards, up to :data:`MAX_AUTO_SHARD_SIZE`.

    Each shard costs a fixed amount besides its items (two Prefect task runs, a GX validation, a commit
    and a manifest rewrite): a fraction of a second, which at 4,096 items of a sentence is about a tenth of
    its embedding on two CPU cores. Large sets get larger shards (a million items: 32,768 per shard, 31
    shards); small ones keep enough shards to spread over the workers and to lose little when interrupted.
    Every size is 4,096 times a power of two, so shards of two sizes nest: a part committed at one size is
    inside a shard of a larger size, which supersedes it (:func:`merge_part`), or covers a shard of a
    smaller one, which is then done (:func:`pending_shards`).
    """
    size = SHARD_SIZE
    while size < MAX_AUTO_SHARD_SIZE and n_items >= 2 * size * MIN_AUTO_SHARDS:
        size *= 2
    return size


def split_shards(probe_set: str, items: pl.DataFrame, fingerprint: str, params: dict, size: int) -> list[Shard]:
    """Cut ``items`` (in their stable order) into shards of ``size`` items."""
    ids = items["item_id"].to_list()
    texts = items["text"].to_list()
    hashes = hash_texts(texts)
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


def merge_part(manifest: Manifest, part: PartInfo, part_ids: PartRows, owners: dict[str, str]) -> list[str]:
    """Add ``part`` to ``manifest``; drop older parts it supersedes. Returns the dropped files.

    ``owners`` maps every item of the manifest's parts to its part's shard id (:class:`CommitIndex`); it
    is updated to the new manifest. An older part is superseded when all its items are in the new part:
    a ``--limit`` prefix of the same shard, a smaller shard of the same items, or the same items with a
    changed text (or no text hash yet), whose rows the new part replaces, so an item never has two rows.
    A partial overlap means the probe set's items changed under a committed release, which would mix two
    versions of items: refuse it (nothing changes). The cost is that of the new part's rows, not of the
    partition's: a million-item partition commits its last part as fast as its first.
    """
    overlap: dict[str, int] = {}
    for i in part_ids:
        owner = owners.get(i)
        if owner is not None and owner != part.shard_id:
            overlap[owner] = overlap.get(owner, 0) + 1
    by_id = {p.shard_id: p for p in manifest.parts}
    for owner, n in overlap.items():
        old = by_id.get(owner)
        if old is not None and n < old.rows:
            raise ValueError(
                f"part {part.file} overlaps committed part {old.file} of {manifest.model}/{manifest.release}/"
                f"{manifest.probe_set} in {n} items without containing it: the probe set changed "
                "since that release was embedded. Audit it under a new --release label."
            )
    # the same shard embedded again (e.g. after a failed commit) has the same items: its old entry is replaced
    gone = {part.shard_id, *overlap}
    dropped = [p.file for p in manifest.parts if p.shard_id in overlap]
    manifest.parts = sorted([*(p for p in manifest.parts if p.shard_id not in gone), part], key=lambda p: p.start)
    for i in part_ids:
        owners[i] = part.shard_id
    return dropped


class CommitIndex:
    """Which committed part holds each item of one partition, kept in the committing process.

    Committing a part must find the parts it supersedes or overlaps (:func:`merge_part`); reading every
    committed part's ids at each commit made an audit's commits quadratic in its parts (a million items in
    4,096-item shards read 30,000 parts). The index is read from storage once, and again only when the
    manifest's parts are not the ones it last saw (another writer, a failed commit): the parts are named
    by their sha256, so an unchanged list means unchanged rows.
    """

    def __init__(self) -> None:
        self.parts: tuple[tuple[str, str], ...] | None = None  # (shard_id, sha256) the owners reflect
        self.owners: dict[str, str] = {}

    @staticmethod
    def signature(manifest: Manifest | None) -> tuple[tuple[str, str], ...]:
        return tuple((p.shard_id, p.sha256) for p in manifest.parts) if manifest is not None else ()

    def owners_for(self, store: Store, manifest: Manifest | None) -> dict[str, str]:
        """``item_id -> shard_id`` of ``manifest``'s parts (read from storage unless already known)."""
        sig = self.signature(manifest)
        if sig != self.parts:
            self.owners = {i: sid for sid, rows in committed_item_ids(store, manifest).items() for i in rows}
            self.parts = sig
        return self.owners

    def committed(self, manifest: Manifest) -> None:
        """Record that ``manifest`` (as written) is what the owners now reflect."""
        self.parts = self.signature(manifest)
