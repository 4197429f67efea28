"""Which shards of a stored probe set are still to embed, answered by queries over the stored files.

The rules are those of :mod:`pipeline.storage.shards` (a shard is done when every one of its items is
committed under its current text; a new part supersedes the committed parts whose items it holds; a partial
overlap is an error), but nothing per item is held in Python: DuckDB joins the probe set's stored items
(``item_id``, ``text_sha256``, row number) with the committed parts' rows, out of core under a memory limit,
and the shard ids are hashed from the stored items one shard at a time. A resume of a 10-million-item set so
needs the memory of one shard, not a set of ten million ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage.shards import shard_id
from pipeline.storage.store import Manifest, Store

MEMORY_LIMIT = "256MB"  # DuckDB spills to its temp directory past this: a worker's memory stays flat at any size


@dataclass(frozen=True)
class PlannedShard:
    """One shard to embed, by position: no items, only its id, range and the committed parts it replaces."""

    shard_id: str
    start: int
    size: int
    supersedes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoredPlan:
    """The shards still to embed, how many of the planned ones are already done, and the ids of the whole
    set's shards past a ``--limit`` (their orphan parts are kept for a later audit of the whole set)."""

    todo: list[PlannedShard]
    skipped: int
    later: frozenset[str]


def items_rows(store: Store, probe_set: str) -> int:
    """Rows of the stored items table of ``probe_set`` (from the Parquet footer)."""
    rel = f"{store.probes_dir(probe_set)}/items.parquet"

    def read() -> int:
        with store.fs.open(store.path(rel), "rb") as fh:
            return pq.ParquetFile(fh).metadata.num_rows

    return store.retry(read, f"read {rel}")


@contextlib.contextmanager
def spilling_connection(store: Store, sandbox: bool = True):
    """A DuckDB connection to ``store``'s root that spills to a temporary folder past :data:`MEMORY_LIMIT`, keeping
    insertion order; sandboxed to the root (:func:`pipeline.storage.catalog.connect`) unless ``sandbox`` is false,
    for a step that writes a local file itself."""
    from pipeline.storage.catalog import connect  # imported here: catalog imports this module's neighbours

    con = connect(sandbox=store if sandbox else None, memory_limit=MEMORY_LIMIT)
    try:
        con.execute("set preserve_insertion_order = true").fetchall()
        if not store.is_local:
            con.register_filesystem(store.query_fs)
        yield con
    finally:
        con.close()


def _committed_view(con, store: Store, manifest: Manifest | None) -> None:
    """``committed(item_id, text_sha256, owner)``: every row of the partition's committed parts, by shard id."""
    if manifest is None or not manifest.parts:
        con.execute("create temp table committed (item_id varchar, text_sha256 varchar, owner varchar)").fetchall()
        return
    d = store.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)
    owners = pa.table({"file": [store.url(f"{d}/{p.file}") for p in manifest.parts],
                       "owner": [p.shard_id for p in manifest.parts]})
    con.register("part_owners", owners)
    files = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in owners["file"].to_pylist()) + "]"
    described = con.execute(f"describe select * from read_parquet({files}, union_by_name = true)").fetchall()
    names = {r[0] for r in described}
    # a part written before rows carried the hash has none: its rows then match no item (never done)
    sha = "text_sha256" if "text_sha256" in names else "null::varchar"
    con.execute(f"""
        create temp table committed as
        with rows as (
            select item_id, {sha} as text_sha256, filename
            from read_parquet({files}, union_by_name = true, filename = true)
        ),
        final as (
            select rows.item_id, rows.text_sha256, part_owners.owner
            from rows join part_owners on rows.filename = part_owners.file
        )
        select * from final
    """).fetchall()


def plan_stored(store: Store, probe_set: str, fingerprint: str, params: dict, size: int, limit: int | None,
                manifest: Manifest | None) -> StoredPlan:
    """Plan the shards of the first ``limit`` items (all when ``None``) of the stored set ``probe_set``.

    Same decisions as :func:`pipeline.storage.shards.pending_shards` and :func:`~pipeline.storage.shards.
    superseded_parts` over the Python index of committed ids, which the tests compare it with.
    """
    n = items_rows(store, probe_set)
    cut = n if limit is None else min(limit, n)
    items = store.url(f"{store.probes_dir(probe_set)}/items.parquet").replace("'", "''")
    with spilling_connection(store) as con:
        _committed_view(con, store, manifest)
        con.execute(f"""
            create temp view items as
            select file_row_number as row, item_id, text_sha256 from read_parquet('{items}', file_row_number = true)
        """).fetchall()
        pending = sorted(r[0] for r in con.execute("""
            with missing as (
                select items.row
                from items left join committed
                  on committed.item_id = items.item_id and committed.text_sha256 = items.text_sha256
                where items.row < $cut and committed.item_id is null
            ),
            final as (select distinct row // $size as shard from missing)
            select shard from final
        """, {"cut": cut, "size": size}).fetchall())
        ranges = {k: (k * size, min(size, cut - k * size)) for k in pending}
        last = (cut - 1) // size if cut else None
        if last in ranges and cut % size and cut < n:
            # the limit cuts this shard; when a committed part also holds items past the cut, a cut part could
            # replace only some of its rows (two rows for an item, or a partial overlap): embed the whole shard
            stop = min(n, (last + 1) * size)
            beyond = con.execute("""
                select count(*) from items join committed using (item_id) where items.row >= $cut and items.row < $stop
            """, {"cut": cut, "stop": stop}).fetchall()[0][0]
            if beyond:
                ranges[last] = (last * size, stop - last * size)
        overlaps = _overlaps(con, ranges, size)
        sizes = dict(con.execute("select owner, count(*) from committed group by owner").fetchall())
    ids = dict(_shard_ids(store, probe_set, fingerprint, params, [ranges[k] for k in pending]))
    todo = []
    for k in pending:
        start, length = ranges[k]
        sid = ids[start, length]
        owners = {o: c for o, c in overlaps.get(k, {}).items() if o != sid}
        for owner, count in owners.items():
            if count < sizes[owner]:
                files = {p.shard_id: p.file for p in manifest.parts}
                raise ValueError(
                    f"shard {sid} of probe set {probe_set!r} overlaps committed part {files.get(owner, owner)} of "
                    f"{manifest.model}/{manifest.release} in {count} items without containing it: the probe set "
                    "changed since that release was embedded. Audit it under a new --release label."
                )
        todo.append(PlannedShard(sid, start, length, tuple(sorted(owners))))
    planned = (cut + size - 1) // size
    later: frozenset[str] = frozenset()
    if limit is not None and cut < n:
        past = [(s, min(size, n - s)) for s in range(planned * size, n, size)]
        if cut % size:  # the whole shard the limit cuts (unless it is to be embedded whole: in todo)
            past.insert(0, (last * size, min(size, n - last * size)))
        later = frozenset(sid for _, sid in _shard_ids(store, probe_set, fingerprint, params, past)) - {
            s.shard_id for s in todo}
    return StoredPlan(todo, planned - len(todo), later)


def _overlaps(con, ranges: dict[int, tuple[int, int]], size: int) -> dict[int, dict[str, int]]:
    """For each shard to embed: committed rows of its items, by the part (shard id) that holds them."""
    if not ranges:
        return {}
    spans = pa.table({"shard": list(ranges), "lo": [s for s, _ in ranges.values()],
                      "hi": [s + n for s, n in ranges.values()]})
    con.register("spans", spans)
    out: dict[int, dict[str, int]] = {}
    for shard, owner, count in con.execute("""
        with held as (
            select spans.shard, committed.owner
            from spans join items on items.row >= spans.lo and items.row < spans.hi
            join committed on committed.item_id = items.item_id
        ),
        final as (select shard, owner, count(*) as n from held group by shard, owner)
        select * from final
    """).fetchall():
        out.setdefault(shard, {})[owner] = count
    return out


def _shard_ids(store: Store, probe_set: str, fingerprint: str, params: dict, spans: list[tuple[int, int]]
               ) -> Iterator[tuple[tuple[int, int], str]]:
    """``((start, size), shard id)`` of each span of the stored items, read one span at a time."""
    from pipeline.storage.shards import read_rows  # the reader read_shard uses: the same rows, the same hash

    rel = f"{store.probes_dir(probe_set)}/items.parquet"
    if not spans:
        return
    with store.fs.open(store.path(rel), "rb") as fh:
        pf = pq.ParquetFile(fh)
        for start, length in spans:
            table = read_rows(pf, start, length, ["item_id", "text_sha256"])
            yield (start, length), shard_id(table["item_id"].to_pylist(), table["text_sha256"].to_pylist(),
                                            fingerprint, params)


__all__ = ["MEMORY_LIMIT", "PlannedShard", "StoredPlan", "items_rows", "plan_stored", "spilling_connection"]
