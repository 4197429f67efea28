"""The audit's steps as plain functions: flows/tasks.py wraps each as a Prefect task.

Each step does one thing and takes explicit inputs (settings, resolved model,
shard), so it can run in the flow process or on any Dask worker.
"""

from __future__ import annotations

import time

import numpy as np
import polars as pl

from pipeline.analysis.analyses import AUDIT_ANALYSES, run_analysis
from pipeline.probes import ProbeSet, load_probe_set, write_probe_tables
from pipeline.settings import Settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.parts import StagedPart, commit_part, embeddings_table, stage_part
from pipeline.storage.runs import write_results
from pipeline.storage.shards import Shard, committed_item_ids, pending_shards, split_shards
from pipeline.storage.store import Manifest, open_store


def embedding_params(resolved, settings: Settings) -> dict:
    """Parameters that change the stored rows (and so the shard hashes)."""
    return {
        "pooling": resolved.spec.pooling,
        "max_length": resolved.max_length,
        "vector_dtype": settings.vector_dtype,
    }


def manifest_template(model: str, release: str, probe_set: str, resolved, settings: Settings) -> Manifest:
    return Manifest(
        model=model, release=release, probe_set=probe_set, fingerprint=resolved.fingerprint,
        params=embedding_params(resolved, settings), dim=resolved.dim, vector_dtype=settings.vector_dtype,
    )


def load_and_store_probes(settings: Settings, spec: str, run_id: str | None = None,
                          replace: bool = False) -> ProbeSet:
    """Load and validate a probe set, then write its tables (the whole set, whatever --limit says).

    A probe file whose set name is already stored with other data is refused unless ``replace``
    (:func:`pipeline.probes.stored.refuse_silent_replace`); sets named by the user are read from the store.
    """
    from pipeline.probes import brings_file
    from pipeline.probes.base import KINDS
    from pipeline.probes.stored import refuse_silent_replace
    from pipeline.quality.gates import gate_probe_set

    store = open_store(settings)
    ps = load_probe_set(spec, settings.storage_options(), store=store)
    if brings_file(spec):
        refuse_silent_replace(store, ps, spec, replace)
    gate_probe_set(store, ps, KINDS, run_id)  # GX suites, before anything is written
    write_probe_tables(store, ps)
    return ps


def plan_shards(
    settings: Settings, ps: ProbeSet, model: str, release: str, resolved, limit: int | None
) -> tuple[list[Shard], int]:
    """Shards of the first ``limit`` items still to embed, and how many shards were already committed.

    A shard is done only when every item is committed with its current text (item_id and text_sha256,
    :func:`pipeline.storage.shards.pending_shards`); a changed text is embedded again and its new part replaces
    the old one when it commits.
    """
    store = open_store(settings)
    params = {**embedding_params(resolved, settings), **ps.shard_params()}
    full = split_shards(ps.name, ps.items, resolved.fingerprint, params, settings.shard_size)
    shards = full if limit is None else split_shards(ps.name, ps.items.head(limit), resolved.fingerprint, params,
                                                     settings.shard_size)
    manifest = store.read_manifest(model, release, ps.name)
    if manifest is not None:  # trust committed parts only after checking their bytes (sha256)
        from pipeline.storage.verify import raise_if_corrupt, verify_manifest

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
    return todo, len(shards) - len(todo)


def embed_shard(settings: Settings, resolved, model: str, release: str, shard: Shard, run_id: str) -> StagedPart:
    """Embed one shard with the worker's cached model and write it to staging."""
    from pipeline.embedding.embed import get_embedder

    t0 = time.perf_counter()
    embedder = get_embedder(
        resolved, device=settings.device, threads=settings.torch_threads(),
        batch_tokens=settings.batch_tokens, max_batch_size=settings.max_batch_size,
    )
    t1 = time.perf_counter()
    result = embedder.embed(shard.texts)
    t2 = time.perf_counter()
    table = embeddings_table(model, release, shard, result, settings.vector_dtype)
    part = stage_part(open_store(settings), run_id, model, release, shard, table)
    part.timings = {"model_load": t1 - t0, "embedding": t2 - t1, "storage": time.perf_counter() - t2}
    return part


def validate_and_commit(
    settings: Settings, part: StagedPart, shard: Shard, template: Manifest, run_id: str
) -> tuple[int, dict]:
    """Check a staged part; commit it, or quarantine it and raise naming what failed.

    Returns the committed row count and the seconds spent validating and committing.
    """
    store = open_store(settings)
    t0 = time.perf_counter()
    from pipeline.quality.gates import gate_part
    from pipeline.storage import lease

    # GX suite, including the shard's text hashes; quarantines and raises on failure
    gate_part(store, part, shard.item_ids, template, run_id, shard.text_sha256)
    t1 = time.perf_counter()
    lease.ensure(store, part.model, part.release, run_id)  # one writer per release (pipeline/storage/lease.py)
    commit_part(store, part, template)
    return part.rows, {"validation": t1 - t0, "storage": time.perf_counter() - t1}


def compute_token_norms(settings: Settings, resolved, model: str, release: str) -> dict | None:
    """Norms of the input token-embedding table and the tokens' zipf, on a worker.

    Returns ``{"norms", "properties"}`` frames for :func:`commit_token_norms`, or None when
    the release's token norms are already stored (they are computed once per release).
    """
    from pipeline.embedding.embed import get_embedder
    from pipeline.probes.frequency import token_properties

    store = open_store(settings)
    if store.exists(f"{store.token_norms_dir(model, release)}/part-0.parquet"):
        return None
    embedder = get_embedder(
        resolved, device=settings.device, threads=settings.torch_threads(),
        batch_tokens=settings.batch_tokens, max_batch_size=settings.max_batch_size,
    )
    tn = embedder.token_norms()
    norms = pl.DataFrame({
        "model": model, "release": release,
        "token_id": np.asarray(tn.token_ids, dtype=np.int64), "token": list(tn.tokens),
        "norm": np.asarray(tn.norms, dtype=np.float64),
    })
    props = token_properties(model, release, norms["token_id"].to_list(), norms["token"].to_list())
    return {"norms": norms, "properties": props}


def commit_token_norms(settings: Settings, computed: dict | None, model: str, release: str,
                       run_id: str | None = None) -> int:
    """Gate the token norms (GX, in the flow process) and write them; returns rows written (0 if present)."""
    from pipeline.quality.gates import gate_token_norms

    store = open_store(settings)
    d = store.token_norms_dir(model, release)
    if computed is None:
        write_token_properties(store, model, release)  # roots written before token_properties existed
        return 0
    frame = computed["norms"]
    gate_token_norms(store, frame.to_arrow(), model, release, run_id)  # GX suite before anything is written
    if not store.exists(f"{d}/properties.parquet"):
        store.write_table(f"{d}/properties.parquet", computed["properties"].to_arrow())
    # last: part-0 marks the release's tokens done
    rows, _ = store.write_table(f"{d}/part-0.parquet", frame.to_arrow())
    return rows


def write_token_properties(store, model: str, release: str, norms: pl.DataFrame | None = None) -> int:
    """Zipf of the whole-word tokens, beside token_norms (view ``token_properties``); 0 if present."""
    from pipeline.probes.frequency import token_properties

    d = store.token_norms_dir(model, release)
    if store.exists(f"{d}/properties.parquet"):
        return 0
    if norms is None:
        norms = pl.from_arrow(store.read_table(f"{d}/part-0.parquet", columns=["token_id", "token"]))
    table = token_properties(model, release, norms["token_id"].to_list(), norms["token"].to_list())
    rows, _ = store.write_table(f"{d}/properties.parquet", table.to_arrow())
    return rows


def run_analyses(settings: Settings, model: str, release: str, run_id: str) -> pl.DataFrame:
    """Run the audit's SQL analyses over committed data and store their ``results`` rows."""
    store = open_store(settings)
    con = open_catalog(store)
    frames = []
    try:
        for name in AUDIT_ANALYSES:
            res = run_analysis(con, name, model, release, run_id)
            if res.height:  # an analysis whose inputs the probe sets lack has no rows, and no file
                write_results(store, run_id, name, res)
                frames.append(res)
    finally:
        con.close()  # the catalog keeps the memory it freed until it closes (pipeline.storage.catalog.connect)
    return pl.concat(frames) if frames else pl.DataFrame()


def compare_with_previous(settings: Settings, model: str, release: str, run_id: str, thresholds):
    """Alerts for statistics that moved past their threshold since the previous release; stores them.

    Returns ``(previous_release or None, alerts frame)``.
    """
    from pipeline.analysis.compare import compare_runs, previous_release, write_alerts

    store = open_store(settings)
    con = open_catalog(store)
    previous = previous_release(con, model, release)
    _, alerts = compare_runs(con, model, release, run_id, previous, thresholds)
    write_alerts(store, run_id, alerts)
    return (previous[0] if previous else None), alerts


def find_new_releases(settings: Settings, watched) -> list[tuple[str, str]]:
    """Releases of a watched model that no finished audit covers yet."""
    from pipeline.analysis.compare import release_history
    from pipeline.audit.watch import discover_releases

    hist = release_history(open_catalog(open_store(settings)), watched.name)
    audited = set(hist["fingerprint"].to_list()) | set(hist["release"].to_list())
    return discover_releases(watched, audited)


def render_report(settings: Settings, model: str, release: str) -> str:
    """Render the release's HTML report and the model's cross-release index; returns the report's URL."""
    from pipeline.analysis.report import render_report as render

    return render(open_store(settings), model, release)
