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

import bisect
import hashlib
import json
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.probes.base import text_sha256 as hash_texts  # Shard's argument of that name would shadow it
from pipeline.storage.store import Manifest, Store

SHARD_SIZE = 4096  # items per shard of a small set (settings.shard_size, when given, decides)
MIN_AUTO_SHARDS = 8  # a set gets larger shards only while it still makes at least this many
# The flow spends ~0.14 CPU-s per shard (its Prefect task run submitted and read, its batch commit): at the
# 330,000 items/s of an 8-GPU run, 32,768-item shards would need 1.4 flow cores, 131,072-item ones 0.35.
# A part of 131,072 MiniLM vectors is ~200 MB of float32 (768-d: ~400 MB), written by the worker that made it.
MAX_AUTO_SHARD_SIZE = 131072  # workers embedding on a GPU (or mps)
# Workers embedding on CPU stop at 65,536: a shard's items, rows, part and gate are what grows a worker's memory
# with the shard (131,072-item shards peaked ~0.1 GiB higher than 65,536-item ones over the same 10 M set), and
# even the tests' near-free model embeds ~10,000 items/s on a CPU worker: ~0.15 flow CPU-s per 6.5 worker-seconds.
MAX_CPU_SHARD_SIZE = 65536
READ_BATCH_ROWS = 65536  # rows read_rows takes from a Parquet file at a time
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


@dataclass(frozen=True)
class ShardRef:
    """What the flow holds of one shard to embed: where its items are, never the items themselves.

    The worker that embeds it reads the items ``[start, start + size)`` of the stored probe set
    (:func:`read_shard`) and checks they still hash to ``shard_id``. ``supersedes`` are the committed parts
    its part replaces (:func:`superseded_parts`); ``orphan`` names a part of this shard that an earlier run
    wrote but never committed (a kill in between), which the worker checks and reuses instead of embedding.
    """

    probe_set: str
    shard_id: str
    start: int
    size: int
    params: dict = field(default_factory=dict)  # embedding parameters of the shard hash (with the template)
    supersedes: tuple[str, ...] = ()
    orphan: str | None = None


def shard_ref(shard: Shard, params: dict, supersedes: tuple[str, ...] = (), orphan: str | None = None) -> ShardRef:
    """The :class:`ShardRef` of a planned shard."""
    return ShardRef(shard.probe_set, shard.shard_id, shard.start, shard.size, dict(params), supersedes, orphan)


class ProbeSetChangedError(RuntimeError):
    """The stored probe set no longer holds the items a shard was planned with."""


def read_shard(store: Store, ref: ShardRef, fingerprint: str) -> Shard:
    """The shard ``ref`` names, read from the stored probe set's items (only the row groups it spans).

    Raises :class:`ProbeSetChangedError` when those items no longer hash to ``ref.shard_id`` (another audit
    replaced the probe set after this one planned): embedding them would store rows the plan never checked.
    """
    rel = f"{store.probes_dir(ref.probe_set)}/items.parquet"

    def read():
        with store.fs.open(store.path(rel), "rb") as fh:
            return read_rows(pq.ParquetFile(fh), ref.start, ref.size, ["item_id", "text"])

    table = store.retry(read, f"read {rel}")
    ids, texts = table["item_id"].to_pylist(), table["text"].to_pylist()
    shard = Shard(ref.probe_set, ref.shard_id, ref.start, ids, texts)
    if len(ids) != ref.size or shard_id(ids, shard.text_sha256, fingerprint, ref.params) != ref.shard_id:
        raise ProbeSetChangedError(
            f"probe set {ref.probe_set!r} changed while this audit ran: its items {ref.start}..{ref.start + ref.size}"
            f" no longer hash to shard {ref.shard_id} (another `normaudit audit --replace` or `probes add` wrote it)."
            " Nothing of this shard was written; rerun the audit."
        )
    return shard


def read_rows(pf: pq.ParquetFile, start: int, size: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``[start, start + size)`` of a Parquet file (``columns``, or all), reading only the row groups they fall
    in, a batch at a time: rows of those groups outside the range are dropped batch by batch, so a file written
    with large row groups (pyarrow's default is a million rows) is never held a whole group at once."""
    starts = [0]
    for g in range(pf.metadata.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    schema = pf.schema_arrow if columns is None else pa.schema([pf.schema_arrow.field(c) for c in columns])
    # the groups holding the range, by bisection over their first rows (a file may have many small groups)
    g0, g1 = bisect.bisect_right(starts, start) - 1, bisect.bisect_left(starts, start + size)
    batches, skip, left = [], start - starts[g0], size
    if size > 0 and start < starts[-1]:
        for batch in pf.iter_batches(batch_size=min(size, READ_BATCH_ROWS), row_groups=range(g0, g1),
                                     columns=columns):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            batch = batch.slice(skip, left)
            skip, left = 0, left - batch.num_rows
            batches.append(batch)
            if not left:
                break
    return pa.Table.from_batches(batches, schema=schema)


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


def default_shard_size(n_items: int, device: str = "cpu") -> int:
    """Items per shard when the settings give none: :data:`SHARD_SIZE`, doubled while the set still makes
    at least :data:`MIN_AUTO_SHARDS` shards, up to :data:`MAX_CPU_SHARD_SIZE` where the workers embed on
    ``device`` ``cpu``, :data:`MAX_AUTO_SHARD_SIZE` on a GPU.

    Each shard costs a fixed amount besides its items (a Prefect task run, a GX validation on its worker, a
    place in a batched manifest write): a fraction of a second, which at 4,096 items of a sentence is about a
    tenth of its embedding on two CPU cores, and which the one flow process pays for every shard. Large sets
    get larger shards (a million items: 65,536 per shard, 16 shards; 5 million on GPU workers: 131,072, 39
    shards; on CPU workers 65,536, 77 shards); small ones keep enough shards to spread over the workers and to
    lose little when interrupted.
    Every size is 4,096 times a power of two, so shards of two sizes nest: a part committed at one size is
    inside a shard of a larger size, which supersedes it (:func:`superseded_parts`), or covers a shard of a
    smaller one, which is then done (:func:`pending_shards`).
    """
    size, top = SHARD_SIZE, MAX_CPU_SHARD_SIZE if device == "cpu" else MAX_AUTO_SHARD_SIZE
    while size < top and n_items >= 2 * size * MIN_AUTO_SHARDS:
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


def superseded_parts(shards: list[Shard], committed: dict[str, PartRows], manifest: Manifest | None
                     ) -> dict[str, tuple[str, ...]]:
    """For each shard, the committed parts (shard ids) its part replaces when it commits.

    An older part is superseded when all its items are in the new part: a ``--limit`` prefix of the same shard,
    a smaller shard of the same items, or the same items with a changed text (or no text hash yet), whose rows
    the new part replaces, so an item never has two rows. A partial overlap means the probe set's items changed
    under a committed release, which would mix two versions of items: :class:`ValueError`, before anything is
    embedded. Computed once, where the shards are planned (a worker): during the audit only its own shards,
    which never overlap each other, change the partition (the release's lease keeps every other writer out),
    so the committing flow needs no index of item ids.
    """
    owners = {i: sid for sid, rows in committed.items() for i in rows}
    sizes = {sid: len(rows) for sid, rows in committed.items()}
    files = {p.shard_id: p.file for p in manifest.parts} if manifest is not None else {}
    out = {}
    for shard in shards:
        overlap: dict[str, int] = {}
        for i in shard.item_ids:
            owner = owners.get(i)
            if owner is not None and owner != shard.shard_id:
                overlap[owner] = overlap.get(owner, 0) + 1
        for owner, n in overlap.items():
            if n < sizes[owner]:
                raise ValueError(
                    f"shard {shard.shard_id} of probe set {shard.probe_set!r} overlaps committed part "
                    f"{files.get(owner, owner)} of {manifest.model}/{manifest.release} in {n} items without "
                    "containing it: the probe set changed since that release was embedded. Audit it under a new "
                    "--release label."
                )
        out[shard.shard_id] = tuple(sorted(overlap))
    return out
