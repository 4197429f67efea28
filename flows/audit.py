"""The ``audit_release`` flow: wiring only; each step lives in ``pipeline.steps``."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

from prefect import flow, get_run_logger
from prefect.futures import as_completed

from flows import tasks
from flows.runners import dask_runner, prefect_api
from pipeline.runs import RunRecord, new_run_id
from pipeline.settings import Settings, load_settings
from pipeline.steps import embedding_params, manifest_template
from pipeline.store import open_store


@dataclass
class AuditSummary:
    """What an audit did, for the CLI and for callers."""

    run_id: str
    model: str
    release: str
    fingerprint: str
    root: str
    embedded_items: dict = field(default_factory=dict)
    skipped_shards: dict = field(default_factory=dict)
    results: object = None
    timings: dict = field(default_factory=dict)


@flow(name="audit_release")
def audit_release(
    model: str,
    probes: list[str],
    release: str | None = None,
    limit: int | None = None,
    overrides: dict | None = None,
) -> AuditSummary:
    """Embed probe sets with a model, validate and commit every shard, then run the analyses.

    ``overrides`` are non-secret settings (root, batch sizes, ...); credentials are read
    from the environment by :mod:`pipeline.settings` and never pass through flow parameters.
    """
    log = get_run_logger()
    settings = load_settings(**(overrides or {}))
    timings: dict[str, float] = {}
    t = time.perf_counter()
    open_store(settings).check_writable()
    resolved = tasks.resolve_model(model)
    timings["resolve_model"] = time.perf_counter() - t
    name = resolved.spec.name
    release = release or resolved.fingerprint[:12]
    run = RunRecord(
        run_id=new_run_id(), model=name, release=release, fingerprint=resolved.fingerprint,
        probe_set=",".join(probes),
        params={**embedding_params(resolved, settings), "limit": limit, "shard_size": settings.shard_size,
                "batch_tokens": settings.batch_tokens, "device": settings.device},
    )
    tasks.register_run(settings, run)
    summary = AuditSummary(run.run_id, name, release, resolved.fingerprint, open_store(settings).root_url)
    try:
        t = time.perf_counter()
        token_norms = tasks.write_token_norms.submit(settings, resolved, name, release)
        for spec in probes:
            ps = tasks.load_probes(settings, spec)
            todo, skipped = tasks.plan_shards(settings, ps, name, release, resolved, limit)
            summary.skipped_shards[ps.name] = skipped
            if not todo:
                log.info("%s: nothing to embed, all %d shards already committed", ps.name, skipped)
            else:
                log.info("%s: embedding %d shards (%d already committed)", ps.name, len(todo), skipped)
            template = manifest_template(name, release, ps.name, resolved, settings)
            futures = {tasks.embed_shard.submit(settings, resolved, name, release, s, run.run_id): s for s in todo}
            embedded = 0
            for fut in as_completed(list(futures)):
                embedded += tasks.validate_and_commit(settings, fut.result(), futures[fut], template, run.run_id)
            summary.embedded_items[ps.name] = embedded
        token_norms.result()
        timings["embed_and_commit"] = time.perf_counter() - t
        t = time.perf_counter()
        summary.results = tasks.run_analyses(settings, name, release, run.run_id)
        timings["analyses"] = time.perf_counter() - t
        run.status = "completed"
    except BaseException as exc:
        run.status, run.message = "failed", f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        run.finished_at, run.timings = dt.datetime.now(dt.UTC), timings
        tasks.register_run(settings, run)
    summary.timings = timings
    return summary


def run_audit(settings: Settings, model: str, probes: list[str], release: str | None = None,
              limit: int | None = None, overrides: dict | None = None) -> AuditSummary:
    """Run :func:`audit_release` on the Dask task runner the settings name."""
    with prefect_api():
        return audit_release.with_options(task_runner=dask_runner(settings))(
            model=model, probes=probes, release=release, limit=limit, overrides=overrides or {}
        )
