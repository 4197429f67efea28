"""The audit's steps as plain functions; flows/audit.py declares each as a Prefect task.

Each step does one thing and takes the audit's :class:`~pipeline.audit.context.AuditContext` plus its
own inputs (a probe set, a shard), so it can run in the flow process or on any Dask worker.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.analysis.compare import release_history
from pipeline.audit.child import run_in_child
from pipeline.audit.context import AuditContext
from pipeline.audit.preflight import checked_on_worker, unknown_token_warning
from pipeline.audit.stored_set import planned_from_store, unknown_in_stored
from pipeline.audit.watch import WatchedModel, discover_releases
from pipeline.embedding.devices import pick_device
from pipeline.embedding.embed import get_embedder
from pipeline.embedding.models import ResolvedModel, get_spec, resolve_model
from pipeline.embedding.precision import refuse_mixed_release
from pipeline.probes import ProbeSet, brings_file, load_probe_set, write_probe_tables
from pipeline.probes.base import KINDS
from pipeline.probes.frequency import token_properties
from pipeline.probes.stored import refuse_silent_replace
from pipeline.quality import datadocs, gates
from pipeline.settings import Settings
from pipeline.storage import lease
from pipeline.storage.catalog import open_catalog
from pipeline.storage.parts import (
    PART_NAME,
    WrittenPart,
    commit_parts,
    embeddings_table,
    encode_table,
    orphans,
    read_orphan,
    write_part,
)
from pipeline.storage.plan import items_rows, plan_stored
from pipeline.storage.runs import find_abandoned, sweep_abandoned
from pipeline.storage.shards import (
    PartRows,
    Shard,
    ShardRef,
    committed_item_ids,
    default_shard_size,
    pending_shards,
    read_shard,
    split_shards,
)
from pipeline.storage.store import Manifest, Store, open_store
from pipeline.storage.verify import raise_if_corrupt, verify_manifest

_log = logging.getLogger(__name__)
CHILD_PROCESS_BYTES = 8 << 20  # a probe file (or stored set) over this is prepared in a child process: ~1 M sentences

def embedding_params(resolved, settings: Settings) -> dict:
    """Parameters that change the stored rows (and so the shard hashes). A reduced ``precision`` is one of them;
    float32 is left out, so float32 shards keep the hashes they had before precision was a setting."""
    params = {
        "pooling": resolved.spec.pooling,
        "max_length": resolved.max_length,
        "vector_dtype": settings.vector_dtype,
    }
    if settings.precision != "float32":
        params["precision"] = settings.precision
    return params


def manifest_template(ctx: AuditContext, probe_set: str) -> Manifest:
    """The manifest every committed part of ``probe_set`` in this audit is checked against."""
    return Manifest(
        model=ctx.model, release=ctx.release, probe_set=probe_set, fingerprint=ctx.resolved.fingerprint,
        params=embedding_params(ctx.resolved, ctx.settings), dim=ctx.resolved.dim,
        vector_dtype=ctx.settings.vector_dtype, precision=ctx.settings.precision,
    )


def resolve(model: str) -> ResolvedModel:
    """Resolve a model name, directory or hub id to local weights with their fingerprint."""
    return resolve_model(get_spec(model))


def load_and_store_probes(settings: Settings, spec: str, run_id: str | None = None,
                          replace: bool = False) -> ProbeSet:
    """Load and validate a probe set, then write its tables (the whole set, whatever --limit says).

    A probe file whose set name is already stored with other data is refused unless ``replace``
    (:func:`pipeline.probes.stored.refuse_silent_replace`); sets named by the user are read from the store.
    """
    store = open_store(settings)
    ps = load_probe_set(spec, settings.storage_options(), store=store)
    if brings_file(spec):
        refuse_silent_replace(store, ps, spec, replace)
    gates.gate_probe_set(store, ps, KINDS, run_id)  # GX suites, before anything is written
    write_probe_tables(store, ps)
    return ps


@dataclass
class ProbePlan:
    """What the flow holds of one probe set to embed: its name and its shards' refs, never its items."""

    name: str
    refs: list[ShardRef]
    skipped: int  # shards already committed
    reusable: int = 0  # refs with an orphan part to check and reuse instead of embedding
    warnings: list[str] = field(default_factory=list)
    # shard ids past a --limit: their orphans are kept for a later audit of the whole set to reuse
    later: frozenset[str] = frozenset()


def prepare_probes(ctx: AuditContext, spec: str, limit: int | None = None, replace: bool = False) -> ProbePlan:
    """Load, gate and store a probe set, then plan its shards: the per-item work before embedding, on a worker.

    The flow gets back only a :class:`ProbePlan` (a few hundred bytes per shard), so its memory does not grow
    with the probe set. A probe file too large for the CLI's pre-flight (:data:`pipeline.audit.preflight.
    PREFLIGHT_MAX_BYTES`) has its unknown-token check here instead, and its warning comes back in the plan.
    A set stored under the root and named by the user, over the pre-flight's size, is planned from its files and
    checked in blocks (:mod:`pipeline.audit.stored_set`). Another set over :data:`CHILD_PROCESS_BYTES` is prepared
    in a child process of the worker (:func:`pipeline.audit.child.run_in_child`): millions of items held ~12 GiB
    for a minute, more than a worker of a 24 GiB machine may keep; the worker goes on without that memory.
    """
    size = checked_on_worker(spec, ctx.settings, ctx.store)
    if planned_from_store(spec, size):  # a large stored set by name: never loaded whole
        plan = plan_stored_set(ctx, spec, {}, limit)
        plan.warnings.extend(unknown_in_stored(ctx, spec, limit))
        return plan
    if size is not None and size > CHILD_PROCESS_BYTES:
        return run_in_child(_prepare, ctx, spec, limit, replace)
    return _prepare(ctx, spec, limit, replace)


def _prepare(ctx: AuditContext, spec: str, limit: int | None, replace: bool) -> ProbePlan:
    ps = load_and_store_probes(ctx.settings, spec, ctx.run_id, replace)
    warning = unknown_token_warning(ctx.settings, ctx.resolved, ps, spec, limit)
    plan = plan_probe_set(ctx, ps, limit)
    plan.warnings.extend([warning] if warning else [])
    return plan


def plan_probe_set(ctx: AuditContext, ps: ProbeSet, limit: int | None) -> ProbePlan:
    """The refs of the stored set ``ps``'s shards still to embed (with the parts each supersedes and any orphan
    to reuse), planned in SQL over the stored files (:func:`pipeline.storage.plan.plan_stored`)."""
    return plan_stored_set(ctx, ps.name, ps.shard_params(), limit)


def _device(ctx: AuditContext) -> str:
    # where the shards will be embedded: plans are made on a worker, so "auto" is its pick (torch is imported
    # there anyway); a flow that plans a file of its own machine for a remote cluster picks for its own
    return ctx.settings.device if ctx.settings.device != "auto" else pick_device("auto")


def plan_stored_set(ctx: AuditContext, name: str, set_params: dict, limit: int | None) -> ProbePlan:
    """:func:`plan_probe_set` of the set stored as ``name``: nothing of it is loaded, whatever its size."""
    store = ctx.store
    params = {**embedding_params(ctx.resolved, ctx.settings), **set_params}
    size = ctx.settings.shard_size or default_shard_size(items_rows(store, name), _device(ctx))  # of the whole set
    manifest = store.read_manifest(ctx.model, ctx.release, name)
    if manifest is not None:  # trust committed parts only after checking their bytes (sha256)
        raise_if_corrupt(store, verify_manifest(store, manifest))
    plan = plan_stored(store, name, ctx.resolved.fingerprint, params, size, limit, manifest)
    d = store.embeddings_dir(ctx.model, ctx.release, name)
    listed = manifest if manifest is not None else manifest_template(ctx, name)
    found = {}
    for file in orphans(store, listed) if store.exists(d) else []:
        m = PART_NAME.match(file)
        if m is not None and m.group("sha"):
            found[m.group("shard")] = file
    refs = [ShardRef(name, s.shard_id, s.start, s.size, dict(params), s.supersedes, found.get(s.shard_id))
            for s in plan.todo]
    return ProbePlan(name, refs, plan.skipped, sum(r.orphan is not None for r in refs), later=plan.later)


def plan_shards(ctx: AuditContext, ps: ProbeSet, limit: int | None) -> tuple[list[Shard], int]:
    """Shards of the first ``limit`` items still to embed, and how many shards were already committed. A shard is
    done only when every item is committed with its current text (item_id and text_sha256,
    :func:`pipeline.storage.shards.pending_shards`); a changed text's new part replaces the old one when it commits.
    """
    todo, skipped, *_ = _plan(ctx, ps, limit)
    return todo, skipped


def _plan(ctx: AuditContext, ps: ProbeSet, limit: int | None
          ) -> tuple[list[Shard], int, Manifest | None, dict[str, PartRows], frozenset[str]]:
    store, resolved = ctx.store, ctx.resolved
    # of the whole set: --limit cuts its shards
    size = ctx.settings.shard_size or default_shard_size(ps.items.height, _device(ctx))
    params = {**embedding_params(resolved, ctx.settings), **ps.shard_params()}
    full = split_shards(ps.name, ps.items, resolved.fingerprint, params, size)
    shards = full if limit is None else split_shards(ps.name, ps.items.head(limit), resolved.fingerprint, params, size)
    manifest = store.read_manifest(ctx.model, ctx.release, ps.name)
    if manifest is not None:  # trust committed parts only after checking their bytes (sha256)
        raise_if_corrupt(store, verify_manifest(store, manifest))
    committed = committed_item_ids(store, manifest)
    todo = pending_shards(shards, committed)
    if todo and todo[-1] is shards[-1] and shards[-1].size < full[len(shards) - 1].size:
        # the limit cuts this shard; when a committed part also holds items past the cut, a cut part could
        # replace only some of its rows (two rows for an item, or a partial overlap): embed the whole shard
        whole = full[len(shards) - 1]
        beyond = set(whole.item_ids[todo[-1].size:])
        if any(beyond & set(rows) for rows in committed.values()):
            todo[-1] = whole
    later = frozenset(s.shard_id for s in full) - {s.shard_id for s in shards} - {s.shard_id for s in todo}
    return todo, len(shards) - len(todo), manifest, committed, later


def _embedder(ctx: AuditContext):
    s = ctx.settings
    return get_embedder(ctx.resolved, device=s.device, threads=s.torch_threads(), batch_tokens=s.batch_tokens,
                        max_batch_size=s.max_batch_size, precision=s.precision)


def embed_shard(ctx: AuditContext, ref: ShardRef, template: Manifest) -> WrittenPart:
    """Embed one shard on a worker, gate it there and write it under its final name (or quarantine it).

    The shard's items are read from the stored probe set (:func:`pipeline.storage.shards.read_shard`). An
    orphan part of the same shard (written by a run killed before its commit) is checked (its bytes against
    the sha256 in its name, then the same suite) and reused instead of embedding again. Nothing is visible until
    the flow commits the returned part (:func:`commit_batch`).
    """
    store = ctx.store
    shard = read_shard(store, ref, ctx.resolved.fingerprint)
    if ref.orphan is not None:
        found = read_orphan(store, ctx.model, ctx.release, ref.probe_set, ref.orphan)
        if found is not None and found[1].shard_id == ref.shard_id:
            data, info = found
            gates.gate_part(store, pq.read_table(io.BytesIO(data)), data, shard, template, ctx.run_id)
            info.start = shard.start
            return WrittenPart(info, ref.probe_set, ref.supersedes, reused=True)
    result = _embedder(ctx).embed(shard.texts)
    table = embeddings_table(ctx.model, ctx.release, shard, result, ctx.settings.vector_dtype)
    data = encode_table(table)
    gates.gate_part(store, table, data, shard, template, ctx.run_id)  # GX suite, text hashes included
    info = write_part(store, ctx.model, ctx.release, shard, data, table.num_rows)
    return WrittenPart(info, ref.probe_set, ref.supersedes)


def commit_batch(ctx: AuditContext, held: lease.Lease, template: Manifest, parts: list[WrittenPart]) -> int:
    """Add written parts to their partition's manifest in one atomic write, under the release's lease ``held``
    (:func:`open_release`); refused with ``LeaseLostError`` unless it is still the current one (the parts then
    stay invisible, for the next audit to reuse). Returns the rows committed."""
    lease.check(ctx.store, held, ctx.model, ctx.release)  # fenced: one writer per release (pipeline/storage/lease.py)
    commit_parts(ctx.store, template, parts)
    return sum(p.info.rows for p in parts)


def sweep_orphans(ctx: AuditContext, held: lease.Lease, probe_set: str, keep: frozenset[str] = frozenset()) -> int:
    """Remove the part files of a partition its manifest does not list, once every shard of it is committed.

    Runs under the release's lease (``held``, checked first) after the audit's own shards have all finished, so
    no writer of this release is left to commit them. Orphans of the shards in ``keep`` (past a ``--limit``:
    :attr:`ProbePlan.later`) stay for a later audit of the whole set to reuse. Returns how many were removed.
    """
    lease.check(ctx.store, held, ctx.model, ctx.release)
    manifest = ctx.store.read_manifest(ctx.model, ctx.release, probe_set)
    if manifest is None:
        return 0
    d = ctx.store.embeddings_dir(ctx.model, ctx.release, probe_set)
    gone = [f for f in orphans(ctx.store, manifest)
            if (m := PART_NAME.match(f)) is None or m.group("shard") not in keep]
    for file in gone:
        ctx.store.rm(f"{d}/{file}")
    return len(gone)


def compute_token_norms(ctx: AuditContext) -> dict | None:
    """Norms of the input token-embedding table and the tokens' zipf, on a worker.

    Returns ``{"norms", "properties"}`` frames for :func:`commit_token_norms`, or None when
    the release's token norms are already stored (they are computed once per release).
    """
    store, model, release = ctx.store, ctx.model, ctx.release
    if store.exists(f"{store.token_norms_dir(model, release)}/part-0.parquet"):
        return None
    tn = _embedder(ctx).token_norms()
    norms = pl.DataFrame({
        "model": model, "release": release,
        "token_id": np.asarray(tn.token_ids, dtype=np.int64), "token": list(tn.tokens),
        "norm": np.asarray(tn.norms, dtype=np.float64),
    })
    props = token_properties(model, release, norms["token_id"].to_list(), norms["token"].to_list())
    return {"norms": norms, "properties": props}


def commit_token_norms(ctx: AuditContext, computed: dict | None) -> int:
    """Gate the token norms (GX, in the flow process) and write them; returns rows written (0 if present)."""
    store, model, release = ctx.store, ctx.model, ctx.release
    d = store.token_norms_dir(model, release)
    if computed is None:
        write_token_properties(store, model, release)  # roots written before token_properties existed
        return 0
    frame = computed["norms"]
    gates.gate_token_norms(store, frame.to_arrow(), model, release, ctx.run_id)  # GX suite before anything is written
    if not store.exists(f"{d}/properties.parquet"):
        store.write_table(f"{d}/properties.parquet", computed["properties"].to_arrow())
    # last: part-0 marks the release's tokens done
    rows, _ = store.write_table(f"{d}/part-0.parquet", frame.to_arrow())
    return rows


def write_token_properties(store: Store, model: str, release: str, norms: pl.DataFrame | None = None) -> int:
    """Zipf of the whole-word tokens, beside token_norms (view ``token_properties``); 0 if present."""
    d = store.token_norms_dir(model, release)
    if store.exists(f"{d}/properties.parquet"):
        return 0
    if norms is None:
        norms = pl.from_arrow(store.read_table(f"{d}/part-0.parquet", columns=["token_id", "token"]))
    table = token_properties(model, release, norms["token_id"].to_list(), norms["token"].to_list())
    rows, _ = store.write_table(f"{d}/properties.parquet", table.to_arrow())
    return rows


def open_release(ctx: AuditContext) -> lease.Lease:
    """Take the release's lease: one audit of a model release at a time; a release holds one precision.
    Returns the lease the run keeps to the end: every commit checks it (fencing), a heartbeat renews it."""
    refuse_mixed_release(ctx.store.manifests(ctx.model, ctx.release), ctx.model, ctx.release, ctx.settings.precision)
    return gates.open_release(ctx.store, ctx.model, ctx.release, ctx.run_id, ctx.settings.lease_ttl_s)


def build_data_docs(ctx: AuditContext) -> str | None:
    """The run's GX Data Docs (a page per validated part), wherever this runs; never fails the audit (logged)."""
    try:
        return datadocs.build_data_docs(ctx.store, ctx.run_id)
    except Exception as exc:  # noqa: BLE001 - the audit is committed and recorded: the docs are a view of it
        _log.warning("Data Docs for run %s were not built: %s: %s", ctx.run_id, type(exc).__name__, exc)
        return None


def close_release(ctx: AuditContext, held: lease.Lease | None, data_docs: bool = True) -> str | None:
    """Release the lease (``held``, None when it was never taken) and build the run's Data Docs next to the data
    (unless ``data_docs`` is False)."""
    return gates.close_release(ctx.store, ctx.model, ctx.release, ctx.run_id, held, data_docs)


def sweep_abandoned_runs(store: Store) -> list[str]:
    """Record runs whose process is gone as ``abandoned``; returns their descriptions."""
    found = find_abandoned(store)
    sweep_abandoned(store, found)
    return [r.describe() for r in found]


def find_new_releases(settings: Settings, watched: WatchedModel) -> list[tuple[str, str]]:
    """Releases of a watched model that no finished audit covers yet."""
    hist = release_history(open_catalog(open_store(settings)), watched.name)
    audited = set(hist["fingerprint"].to_list()) | set(hist["release"].to_list())
    return discover_releases(watched, audited)
