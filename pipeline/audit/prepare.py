"""A large probe file prepared in blocks, on every worker at once, in the memory of one block.

Three steps (flows/audit.py runs each as a task): :func:`split_probe_file` cuts the file into blocks (one
streaming pass); :func:`prepare_block`, one task per block on any worker, validates the block with the same
rules and messages as a whole file (file, line or row, column), gates it with the GX suites, hashes its texts,
gives word items their Zipf and writes it under ``prepare/<run_id>/<set>/``; :func:`assemble_probe_set` checks
what needs the whole file (duplicate ids, the inferred kind, what a stored set of the name holds) with DuckDB
out of core, writes the probe set's tables and plans its shards in SQL (:func:`pipeline.storage.plan.
plan_stored`). Nothing is visible until the whole set is stored: a bad row anywhere stores nothing.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import uuid
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa

from pipeline.audit.child import run_in_child
from pipeline.audit.context import AuditContext
from pipeline.audit.preflight import checked_on_worker, unknown_in_block, unknown_message
from pipeline.probes import brings_file
from pipeline.probes.base import KINDS, RELATION_SCHEMA, ProbeInputError, infer_kind, text_sha256
from pipeline.probes.blocks import BlockSource, read_block
from pipeline.probes.blocks import split_probe_file as split_file
from pipeline.probes.files import probe_set_of
from pipeline.probes.frequency import ZIPF
from pipeline.probes.stored import ITEM_ROW_GROUP, replace_refusal
from pipeline.probes.templates import split_template
from pipeline.quality.datadocs import save_validation, validation_key
from pipeline.quality.suites import DataValidationError, validate_probe_tables
from pipeline.storage.plan import spilling_connection
from pipeline.storage.runs import run_status
from pipeline.storage.store import Store

STAGING = "prepare"  # prepare/<run_id>/<probe set>/: blocks of a set being prepared, never read by a view


@dataclass(frozen=True)
class PreparedBlock:
    """What the flow keeps of one prepared block: counts, and what the whole file's checks need."""

    index: int
    rows: int
    names: tuple[str, ...]  # the block's property columns, in order (the set's are their union, in order)
    inferred: int = 0  # items the kind column left empty
    inferred_words: bool = True  # every such text is one word
    unknown: tuple[str, ...] = ()  # the first unknown-only item ids among the audited rows
    unknown_count: int = 0
    audited: int = 0  # rows under the --limit
    unk_token: str = ""


@dataclass
class Assembled:
    """The stored set's name and what to tell the user (the inferred kind, unknown tokens)."""

    name: str
    warnings: list[str] = field(default_factory=list)


def prepares_in_blocks(spec: str, settings, store: Store) -> bool:
    """Whether ``spec`` is a probe file prepared in blocks: a bare CSV/TSV/JSONL/Parquet file over the pre-flight's
    size (a template of a file, or a stored set, is prepared whole: :func:`pipeline.audit.steps.prepare_probes`)."""
    return brings_file(spec) and split_template(spec) is None and checked_on_worker(spec, settings, store) is not None


def staging_folder(run_id: str, name: str) -> str:
    """Where the blocks of probe set ``name`` sit while run ``run_id`` prepares it."""
    return f"{STAGING}/{run_id}/{name}"


def sweep_staging(store: Store, keep: str) -> int:
    """Remove the staging folders of runs that are not running (killed, or ended before their cleanup)."""
    removed = 0
    for folder in store.glob(f"{STAGING}/*"):
        run_id = posixpath.basename(folder)
        if run_id != keep and run_status(store, run_id) != "running":
            store.rm(folder, recursive=True)
            removed += 1
    return removed


def split_probe_file(ctx: AuditContext, spec: str, name: str) -> list[BlockSource]:
    """Cut the probe file ``spec`` into blocks (one streaming pass; CSV/JSONL blocks go to the staging folder)."""
    sweep_staging(ctx.store, ctx.run_id)
    return split_file(spec, ctx.settings.storage_options(), ctx.store, staging_folder(ctx.run_id, name),
                      ctx.settings.probe_block_rows)


def prepare_block(ctx: AuditContext, name: str, block: BlockSource, limit: int | None) -> PreparedBlock:
    """Validate, gate, hash and write one block (see the module docstring); raises naming the file's row."""
    store = ctx.store
    cols = read_block(block, store, ctx.settings.storage_options())
    ps = probe_set_of(cols, name)
    n = ps.items.height
    given = cols.strings("kind") if "kind" in cols.values else [None] * n
    missing = [t for t, k in zip(ps.items["text"].to_list(), given, strict=True) if not k]
    props_given = [c for c in cols.names if c not in ("item_id", "text", "kind", "lang", "source")]
    # a Zipf the file gives stays; one computed for a word item goes after every given property, as with_zipf does
    zipf_given = ([v is not None and not (isinstance(v, str) and not v.strip()) for v in cols.values[ZIPF]]
                  if ZIPF in props_given else [False] * n)
    _gate(store, ctx.run_id, name, block.index, ps)
    items = ps.items.with_columns(
        pl.Series("text_sha256", text_sha256(ps.items["text"].to_list()), pl.String),
        pl.int_range(block.first_row, block.first_row + n, eager=True, dtype=pl.Int64).alias("row"),
        pl.Series("kind_inferred", [not k for k in given], pl.Boolean))
    flags = items.select("item_id", "row", "kind_inferred").with_columns(pl.Series("zipf_given", zipf_given))
    props = ps.properties.join(flags, on="item_id", how="left", maintain_order="left").with_columns(
        computed=(pl.col("property") == ZIPF) & ~pl.col("zipf_given")).drop("zipf_given")
    folder = staging_folder(ctx.run_id, name)
    store.write_table(f"{folder}/items-{block.index:05d}.parquet", items.to_arrow())
    store.write_table(f"{folder}/properties-{block.index:05d}.parquet", props.to_arrow())
    audited = n if limit is None else max(0, min(limit - block.first_row, n))
    found = unknown_in_block(ctx.resolved, ps.head(audited)) if audited else None
    return PreparedBlock(
        block.index, n, tuple(props_given), len(missing), infer_kind(missing) == "word" if missing else True,
        tuple(found[0][:6]) if found else (), len(found[0]) if found else 0, audited, found[1] if found else "")


def _gate(store: Store, run_id: str, name: str, index: int, ps) -> None:
    """The probe_items and probe_properties suites on one block; raise naming what failed (nothing stored)."""
    for report in validate_probe_tables(name, ps.items, ps.properties, KINDS, meta={"run_id": run_id}):
        table = report.suite.split(".")[0]
        save_validation(store, run_id, validation_key(table, name, f"block-{index:05d}"), report)
        if not report.success:
            raise DataValidationError(
                f"probe set {name!r} ({ps.origin}) failed {report.suite} in rows {ps.first_row + 1}.."
                f"{ps.first_row + ps.items.height}: {report.summary()}. Nothing was written; fix those rows of "
                "the probe set and rerun.", report)


def assemble_probe_set(ctx: AuditContext, url: str, name: str, blocks: list[PreparedBlock], replace: bool,
                       limit: int | None = None) -> Assembled:
    """Check the whole file (duplicate ids, inferred kind, the stored set of its name), store the set's tables
    and remove the staging folder; returns what to tell the user.

    A file of more than one block is assembled in a child process of the worker
    (:func:`pipeline.audit.child.run_in_child`), as the analyses are: DuckDB's whole-file checks raised the
    worker's memory by ~0.1-0.15 GiB above its blocks' (its peak of the audit at 1 M items,
    docs/benchmarks.md), and a long-lived worker keeps what it once held for the embedding after."""
    if len(blocks) > 1:
        return run_in_child(_assemble, ctx, url, name, blocks, replace, limit)
    return _assemble(ctx, url, name, blocks, replace, limit)


def _assemble(ctx: AuditContext, url: str, name: str, blocks: list[PreparedBlock], replace: bool,
              limit: int | None) -> Assembled:
    store = ctx.store
    folder = staging_folder(ctx.run_id, name)
    out = Assembled(name)
    with spilling_connection(store, sandbox=False) as con:  # it writes local files
        for view, table in (("items", "items"), ("props", "properties")):
            con.execute(f"create view {view} as select * from read_parquet({_files(store, folder, table)})").fetchall()
        _refuse_duplicates(con, url)
        kind, note = _inferred_kind(blocks)
        if note:
            out.warnings.append(note)
        names = list(dict.fromkeys(n for b in blocks for n in b.names))
        con.register("prop_order", pa.table({"property": names, "k": list(range(len(names)))}))
        con.execute(f"""
            create temp view new_items as
            select '{_sql(name)}' as probe_set, item_id, text,
                   case when kind_inferred then '{kind}' else kind end as kind, lang, source, text_sha256, row
            from items
        """).fetchall()
        con.execute(f"""
            create temp view new_props as
            with kept as (
                select props.*, case when computed then {len(names)} else prop_order.k end as k
                from props left join prop_order using (property)
                where not (computed and kind_inferred and '{kind}' <> 'word')
            ),
            final as (select '{_sql(name)}' as probe_set, item_id, property, value, computed, k, row from kept)
            select * from final
        """).fetchall()
        out.warnings.extend(_unknown_warning(ctx, name, blocks, limit))  # every text unknown: raises, stores nothing
        if not _unchanged(con, store, name, url, replace):
            _write_tables(con, store, name)
    drop_staging(ctx, name)
    return out


def drop_staging(ctx: AuditContext, name: str) -> None:
    """Remove the blocks of ``name`` this run wrote (and its staging folder, which holds one set at a time)."""
    ctx.store.rm(posixpath.dirname(staging_folder(ctx.run_id, name)), recursive=True)


def _files(store: Store, folder: str, table: str) -> str:
    files = store.glob(f"{folder}/{table}-*.parquet")
    return "[" + ", ".join(f"'{_sql(store.url(f))}'" for f in files) + "]"


def _sql(text: str) -> str:
    return text.replace("'", "''")


def _refuse_duplicates(con, url: str) -> None:
    """The whole file's duplicate ids, worded as a whole file's check words them (first ids, first rows)."""
    con.execute("""
        create temp table dup as
        select item_id, count(*) as n, min(row) as first from items group by item_id having count(*) > 1
    """).fetchall()
    first = [r[0] for r in con.execute("select item_id from dup order by first limit 3").fetchall()]
    if not first:
        return
    total = con.execute("select sum(n) from dup").fetchall()[0][0]
    rows = [r[0] + 1 for r in con.execute(
        "select row from items where item_id in (select item_id from dup) order by row limit 5").fetchall()]
    more = "" if total <= 5 else f" (and {total - 5} more)"
    raise ProbeInputError(f"{url}: duplicate item_id {first} in rows {', '.join(map(str, rows))}{more}; "
                          "ids must be unique within a probe set.")


def _inferred_kind(blocks: list[PreparedBlock]) -> tuple[str, str | None]:
    """The kind of the items the kind column left empty, and the note saying so (as a whole file's reader)."""
    missing = sum(b.inferred for b in blocks)
    if not missing:
        return "word", None
    kind = "word" if all(b.inferred_words for b in blocks if b.inferred) else "sentence"
    reason = "every text is one word without whitespace" if kind == "word" else "some texts are more than one word"
    total = sum(b.rows for b in blocks)
    where = f"its {missing} items" if missing == total else f"{missing} items without a kind"
    return kind, (f"kind {kind!r} inferred for {where} ({reason}); to choose another of {sorted(KINDS)}, add a "
                  "kind column or pass --kind to `normaudit probes add`")


def _unchanged(con, store: Store, name: str, url: str, replace: bool) -> bool:
    """Whether the stored set ``name`` already holds exactly these tables; a different one is refused unless
    ``replace`` (:func:`pipeline.probes.stored.replace_refusal`)."""
    d = store.probes_dir(name)
    if not store.exists(f"{d}/items.parquet"):
        return False
    old = _sql(store.url(f"{d}/items.parquet"))
    con.execute(f"create temp view old_items as select *, file_row_number as row "
                f"from read_parquet('{old}', file_row_number = true)").fetchall()
    changed = con.execute("""
        select count(*) from new_items n full join old_items o using (row)
        where n.item_id is distinct from o.item_id or n.text is distinct from o.text
           or n.kind is distinct from o.kind or n.lang is distinct from o.lang or n.source is distinct from o.source
    """).fetchall()[0][0]
    if not changed:
        old_props = _sql(store.url(f"{d}/properties.parquet"))
        same_props = store.exists(f"{d}/properties.parquet") and not con.execute(f"""
            with old as (select item_id, property, value from read_parquet('{old_props}')),
            new as (select item_id, property, value from new_props),
            final as (select * from (select * from old except all select * from new)
                      union all select * from (select * from new except all select * from old))
            select count(*) from final
        """).fetchall()[0][0]
        rel = f"{d}/relations.parquet"
        no_relations = not store.exists(rel) or store.read_table(rel).num_rows == 0
        if same_props and no_relations:
            return True
    if replace:
        return False
    texts, added, removed = con.execute("""
        select (select count(*) from new_items n join old_items o using (item_id) where n.text <> o.text),
               (select count(*) from new_items n anti join old_items o using (item_id)),
               (select count(*) from old_items o anti join new_items n using (item_id))
    """).fetchall()[0]
    raise replace_refusal(name, store.url(d), url, texts, added, removed, command="audit")


def _write_tables(con, store: Store, name: str) -> None:
    """Write the set's items, properties and (empty) relations, each file whole or not at all."""
    d = store.probes_dir(name)
    with tempfile.TemporaryDirectory(prefix="normaudit-prepare-") as tmp:
        for table, query, groups in (
            # the blocks' files in order, each in its row order: DuckDB keeps that order (preserve_insertion_order,
            # on by default) without a sort of every row
            ("items", "select probe_set, item_id, text, kind, lang, source, text_sha256 from new_items",
             ITEM_ROW_GROUP),
            ("properties", "select probe_set, item_id, property, value from new_props order by k, row", None),
        ):
            local = os.path.join(tmp, f"{table}-{uuid.uuid4().hex}.parquet")
            options = "format parquet, compression zstd" + (f", row_group_size {groups}" if groups else "")
            con.execute(f"copy ({query}) to '{_sql(local)}' ({options})").fetchall()
            store.put_file(local, f"{d}/{table}.parquet")
        relations = pa.table({"probe_set": pa.array([], pa.string()),
                              **{c: pa.array([], pa.string() if t == pl.String else pa.float64())
                                 for c, t in RELATION_SCHEMA.items()}})
        store.write_table(f"{d}/relations.parquet", relations)


def _unknown_warning(ctx: AuditContext, name: str, blocks: list[PreparedBlock], limit: int | None) -> list[str]:
    count = sum(b.unknown_count for b in blocks)
    if not count:
        return []
    n = sum(b.audited for b in blocks)
    first = [i for b in blocks for i in b.unknown][:6]
    token = next(b.unk_token for b in blocks if b.unk_token)
    message = unknown_message(name, first, count, n, token, f"model {ctx.resolved.spec.name!r}")
    if count == n:
        raise ProbeInputError(message)
    return [message]


__all__ = ["Assembled", "PreparedBlock", "assemble_probe_set", "drop_staging", "prepare_block", "prepares_in_blocks",
           "split_probe_file",
           "staging_folder", "sweep_staging"]
