"""Audit flows: wiring only. Every step is a plain function of :mod:`pipeline.audit.steps`, declared as a
Prefect task once, here, beside the flows that run it.

``audit_release`` reads like docs/design.md's "path of an audit": resolve the model,
register the run, embed the probe sets on Dask (``embed_probes``), run the SQL
analyses, compare with the previous release, render the report and the models page, and fail loudly on a
regression.

``embed_probes`` keeps the flow process out of the per-item work: a worker loads, gates and plans each probe
set (``prepare_probes``); workers embed, gate and write each shard's part (``embed_shard``); the flow keeps a
bounded window of shard tasks in flight and adds finished parts to the manifest in batches (``commit_batch``).
It holds a few hundred bytes per shard and nothing per item.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

import dask
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.runtime import flow_run

from flows.interrupts import Interrupted, is_interrupt, shielded, signal_name
from flows.prepare import prepare_in_blocks
from flows.runners import (
    InFlightWindow,
    api_lost,
    dask_runner,
    early_local_cluster,
    gpu_annotation,
    prefect_api,
    workers_can_read,
)
from flows.timings import Timing, recorded_timings
from flows.window import completed_in_window
from pipeline.analysis.compare import AlertThresholds, ReleaseRegression
from pipeline.audit import release_steps, steps
from pipeline.audit.batches import BatchCommitter
from pipeline.audit.context import AuditContext
from pipeline.audit.prepare import prepares_in_blocks
from pipeline.embedding.precision import default_release
from pipeline.progress import reporter
from pipeline.quality.suites import warm_gates
from pipeline.settings import Settings, flow_settings
from pipeline.storage.lease import Heartbeat, Lease, LeaseLostError
from pipeline.storage.runs import RunRecord, new_run_id, run_status, write_run
from pipeline.storage.store import open_store

# How an audit that stopped early is recorded in ``runs``.
INTERRUPTED, FAILED = "interrupted", "failed"


def _task(fn, name: str | None = None, **options):
    # cache_policy=NONE: each step commits its own results to storage, and its inputs (the settings) must
    # never be hashed or persisted. No retries here for storage: the store retries transient errors itself.
    return task(fn, name=name or fn.__name__, cache_policy=NONE, **options)


resolve_model = _task(steps.resolve, "resolve_model")
register_run = _task(write_run, "register_run")
sweep_abandoned_runs = _task(steps.sweep_abandoned_runs)
open_release = _task(steps.open_release)
prepare_probes = _task(steps.prepare_probes)
compute_token_norms = _task(steps.compute_token_norms)
embed_shard = _task(steps.embed_shard)
commit_batch = _task(steps.commit_batch)
sweep_orphans = _task(steps.sweep_orphans)
commit_token_norms = _task(steps.commit_token_norms)
run_analyses = _task(release_steps.run_analyses)
compare_with_previous = _task(release_steps.compare_with_previous)
close_release = _task(steps.close_release)
build_data_docs = _task(steps.build_data_docs)
render_report = _task(release_steps.render_report)
render_models_page = _task(release_steps.render_models_page)


@dataclass
class AuditSummary:
    """What an audit did, for the CLI and for callers."""

    run_id: str
    model: str
    release: str
    fingerprint: str
    root: str
    flow_run_id: str | None = None  # the ``audit_release`` flow run, whose records hold the timings
    embedded_items: dict = field(default_factory=dict)
    skipped_shards: dict = field(default_factory=dict)
    reused_shards: dict = field(default_factory=dict)  # orphan parts of an earlier, killed run committed as they were
    results: object = None
    alerts: object = None
    previous_release: str | None = None
    report: str | None = None
    timings: dict[str, Timing] = field(default_factory=dict)  # filled by run_audit(timings=True)


@flow(name="embed_probes")
def embed_probes(ctx: AuditContext, held: Lease, probes: list[str], limit: int | None = None,
                 replace: bool = False) -> dict:
    """Embed probe sets shard by shard on the Dask task runner; commit the written parts in batches under
    ``held``, the release's lease."""
    log = get_run_logger()
    out = {"embedded": {}, "skipped": {}, "reused": {}}
    with gpu_annotation():
        # submitted first, so an idle worker loads the model and computes these while the probe sets load;
        # at a lower priority, so a worker that joins later takes the first shard before them
        with dask.annotate(priority=-1):
            token_norms = compute_token_norms.submit(ctx)
        for spec in probes:
            if workers_can_read(spec, ctx.settings) and prepares_in_blocks(spec, ctx.settings, ctx.store):
                plan = prepare_in_blocks(ctx, spec, limit, replace)  # a large file: every worker, block by block
            elif workers_can_read(spec, ctx.settings):  # on a worker: the items stay there
                plan = prepare_probes.submit(ctx, spec, limit, replace).result()
            else:  # a file of this machine and a remote cluster: loaded here (an s3:// URL keeps it off the flow)
                plan = prepare_probes(ctx, spec, limit, replace)
            for warning in plan.warnings:
                log.warning(warning)
            out["skipped"][plan.name] = plan.skipped
            log.info("%s: %d shards to embed (%d written by an earlier run, to check and reuse), %d already "
                     "committed", plan.name, len(plan.refs), plan.reusable, plan.skipped)
            out["embedded"][plan.name], out["reused"][plan.name] = _embed_and_commit(ctx, held, plan)
            # parts no manifest lists; those past a --limit stay for a later audit of the whole set to reuse
            sweep_orphans(ctx, held, plan.name, plan.later)
    commit_token_norms(ctx, token_norms.result())
    return out


def _embed_and_commit(ctx: AuditContext, held: Lease, plan: steps.ProbePlan) -> tuple[int, int]:
    """Run ``plan``'s shards in a bounded window and commit their parts in batches; (rows, reused shards)."""
    template = steps.manifest_template(ctx, plan.name)
    batches = BatchCommitter(lambda parts: commit_batch(ctx, held, template, parts))
    progress = reporter()
    progress.start(plan.name, len(plan.refs), sum(r.size for r in plan.refs))
    rows = reused = 0
    try:
        for done in completed_in_window(lambda ref: embed_shard.submit(ctx, ref, template), plan.refs,
                                        InFlightWindow(), batches.wait_s):
            if done is None:  # the waiting parts are due while no shard finished
                batches.flush()
                continue
            part = _shard_result(done[1], done[0])
            rows += part.info.rows
            reused += part.reused
            batches.add(part)
            progress.advance(part.info.rows)
        batches.flush()
    except BaseException as exc:
        # keep what finished before the failure (a batch whose commit failed is still pending: tried once more);
        # an interrupt leaves orphans to reuse, and a lost lease commits nothing more
        if not is_interrupt(exc) and not isinstance(exc, LeaseLostError):
            _commit_finished(ctx, held, template, batches)
        raise
    finally:
        progress.finish()
    return rows, reused


def _commit_finished(ctx: AuditContext, held: Lease, template, batches: BatchCommitter) -> None:
    """After a failure: commit the parts already written and checked, never hiding the failure itself."""
    if not batches.pending:
        return
    try:
        steps.commit_batch(ctx, held, template, batches.pending)
    except Exception as exc:  # noqa: BLE001 - the run's own error is the one to raise; these parts stay orphans
        get_run_logger().warning("%d written part(s) were not committed (%s: %s); the next audit reuses them",
                                 len(batches.pending), type(exc).__name__, exc)


@flow(name="analyse_release")
def analyse_release(ctx: AuditContext, thresholds: AlertThresholds) -> tuple:
    """The SQL analyses, then the comparison with the previous release, on a Dask worker: they read every item,
    and the flow process, which every audit passes through, must not grow with the items.

    Returns ``(results, previous release or None, alerts)``.
    """
    results = run_analyses.submit(ctx).result()
    previous, alerts = compare_with_previous.submit(ctx, thresholds).result()
    return results, previous, alerts


@flow(name="render_pages")
def render_pages(ctx: AuditContext) -> str:
    """The release's report, the models page and the run's Data Docs, side by side on Dask workers (the plots read
    every item's norm, the docs render a page per part); returns the report's URL."""
    report, models, docs = render_report.submit(ctx), render_models_page.submit(ctx), build_data_docs.submit(ctx)
    models.result()
    docs.result()
    return report.result()


def _shard_result(fut, shard):
    """The written part of a shard; a shard no worker could take (Dask's no-workers-timeout) is named."""
    try:
        return fut.result()
    except Exception as exc:
        # imported here: distributed may still be importing on the local cluster's start-up thread
        from distributed.scheduler import NoValidWorkerError

        if not isinstance(exc, NoValidWorkerError):
            raise
        raise RuntimeError(
            f"no Dask worker was available to embed shard {shard.shard_id} of probe set {shard.probe_set!r} "
            f"for {exc.timeout:.0f} s: the workers were lost and none came back (their log lines are above; "
            "distributed.scheduler.no-workers-timeout sets the wait). Committed shards are kept: rerun the "
            "audit to embed the rest."
        ) from exc


@flow(name="audit_release")
def audit_release(
    model: str,
    probes: list[str],
    release: str | None = None,
    limit: int | None = None,
    settings: Settings | None = None,
    name: str | None = None,
    thresholds: AlertThresholds | None = None,
    replace: bool = False,
    run_id: str | None = None,
) -> AuditSummary:
    """Audit one model release end to end; fail the run when a statistic regressed past its threshold.

    ``settings`` (default: from the environment) are recorded by Prefect without credentials, which
    are read from the environment of the process that runs the flow (:func:`pipeline.settings.flow_settings`).
    ``name`` labels the model in storage (default: the registry name or directory name).
    ``replace`` lets a probe file replace a stored probe set of the same name (else that is refused).
    ``run_id`` (default: a new one) lets the caller clean up after the run if it is interrupted.

    However the run ends (completed, alerted, failed, interrupted by Ctrl-C or SIGTERM), its lease is released
    and its end is recorded, and no second signal can cut that short (:func:`flows.interrupts.shielded`).

    The embedding, the analyses and the pages run on one Dask cluster: ``settings.dask_address``, else a local
    cluster started here for this audit (:func:`flows.audit.run_audit` starts it earlier, beside the API).
    """
    settings = flow_settings(settings)
    if not settings.dask_address:
        with early_local_cluster(settings) as scheduler_address:
            settings = settings.model_copy(update={"dask_address": scheduler_address()})
            return _audit(model, probes, release, limit, settings, name, thresholds, replace, run_id)
    return _audit(model, probes, release, limit, settings, name, thresholds, replace, run_id)


def _audit(model: str, probes: list[str], release: str | None, limit: int | None, settings: Settings,
           name: str | None, thresholds: AlertThresholds | None, replace: bool, run_id: str | None) -> AuditSummary:
    """The body of :func:`audit_release`, on the cluster at ``settings.dask_address``."""
    on_cluster = {"task_runner": dask_runner(settings)}
    open_store(settings).check_writable()
    resolved = resolve_model(model)
    ctx = AuditContext(settings, name or resolved.spec.name, release or default_release(resolved.fingerprint,
                       settings.precision), run_id or new_run_id(), resolved)
    run = RunRecord(
        run_id=ctx.run_id, model=ctx.model, release=ctx.release, fingerprint=resolved.fingerprint,
        probe_set=",".join(probes),
        params={**steps.embedding_params(resolved, settings), "limit": limit, "shard_size": settings.shard_size,
                "batch_tokens": settings.batch_tokens, "device": settings.device, "precision": settings.precision},
    )
    summary = AuditSummary(ctx.run_id, ctx.model, ctx.release, resolved.fingerprint, ctx.store.root_url,
                           flow_run_id=flow_run.id)
    held: Lease | None = None
    heartbeat: Heartbeat | None = None
    try:
        # inside: an interrupt while the record is written (its liveness marker first) is recorded too
        register_run(ctx.store, run)
        for abandoned in sweep_abandoned_runs(ctx.store):  # runs a SIGKILL or a crash ended unrecorded
            get_run_logger().warning("abandoned %s: recorded as abandoned", abandoned)
        held = open_release(ctx)  # one audit per release at a time; kept to the end, checked at every commit
        # renewed on a timer from here to the end: a long preparation or shard never lets it lapse
        heartbeat = Heartbeat(ctx.store, held, ctx.model, ctx.release).start()
        embedded = embed_probes.with_options(**on_cluster)(ctx, held, probes, limit, replace)
        summary.embedded_items, summary.skipped_shards = embedded["embedded"], embedded["skipped"]
        summary.reused_shards = embedded["reused"]
        # tasks rather than subflows: a subflow costs about a second of API calls
        summary.results, summary.previous_release, summary.alerts = analyse_release.with_options(**on_cluster)(
            ctx, thresholds or AlertThresholds())
        run.status = "alerted" if summary.alerts.height else "completed"
    except BaseException as exc:
        if is_interrupt(exc) and api_lost():  # stopped by the API watch of flows.runners.prefect_api
            run.status, run.message = INTERRUPTED, f"stopped: {api_lost()}"
        elif is_interrupt(exc):
            run.status, run.message = INTERRUPTED, f"interrupted by {signal_name(exc)}"
        else:
            run.status, run.message = FAILED, f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        with shielded():  # a second Ctrl-C waits for this: the lease and the run's end are always recorded
            if heartbeat is not None:
                heartbeat.stop()
            _record_end(ctx, held, run)
    summary.report = render_pages.with_options(**on_cluster)(ctx)  # after the run record: the report shows it
    if summary.alerts.height:
        exc = ReleaseRegression(
            f"{summary.alerts.height} statistic(s) of {ctx.model} moved past their threshold since release "
            f"{summary.previous_release}: " + "; ".join(summary.alerts["message"].to_list()[:5])
        )
        exc.summary = summary  # the audit itself is committed; callers may still show it
        raise exc
    return summary


def _record_end(ctx: AuditContext, held: Lease | None, run: RunRecord) -> None:
    """Give the lease back (Data Docs built) and record how the run ended.

    After an interrupt the plain functions run, not tasks: the stop must not wait on the Prefect API
    (a service manager's SIGTERM may have stopped it too), and the Data Docs are skipped.
    """
    interrupted = run.status == INTERRUPTED
    step = (lambda t: t.fn) if interrupted else (lambda t: t)
    # a failed run's Data Docs are built here (they show what failed); a finished run's on a worker, with the pages
    step(close_release)(ctx, held, data_docs=run.status == FAILED)
    run.finished_at = dt.datetime.now(dt.UTC)
    if run.status not in (FAILED, INTERRUPTED):
        run.timings = _task_seconds()
    step(register_run)(ctx.store, run)


def _task_seconds() -> dict[str, float]:
    """Seconds per task of this flow run so far, as Prefect recorded them: the run record's ``timings``,
    which outlive a temporary API."""
    try:
        recorded = recorded_timings(flow_run.id, settle_s=1.0)
    except Exception as exc:  # noqa: BLE001 - informational: it must never keep the run's end from being recorded
        get_run_logger().warning("the run's task timings could not be read from Prefect: %s", exc)
        return {}
    # the flow's own total is finished_at - started_at
    return {k: t.seconds for k, t in recorded.items() if not k.startswith("flow ")}


def run_audit(settings: Settings, model: str, probes: list[str], release: str | None = None,
              limit: int | None = None, name: str | None = None, thresholds: AlertThresholds | None = None,
              replace: bool = False, timings: bool = False) -> AuditSummary:
    """Run :func:`audit_release` in this process against one Prefect API (started here if needed).

    The local Dask cluster (when no scheduler address is set) starts while the API boots.
    Ctrl-C or SIGTERM ends it with :class:`~flows.interrupts.Interrupted` once the run has
    recorded its end and the local workers are stopped. With ``timings`` the summary's ``timings``
    hold the start-up phases measured here and the seconds per task that Prefect recorded for the run
    (read before a temporary API stops).
    """
    run_id = new_run_id()
    t = time.perf_counter()
    try:
        with early_local_cluster(settings) as scheduler_address, prefect_api(while_booting=warm_gates):
            phases = {"api_start": Timing(1, time.perf_counter() - t)}
            settings = settings.model_copy(update={"dask_address": scheduler_address()})
            phases["cluster_start_after_api"] = Timing(1, time.perf_counter() - t - phases["api_start"].seconds)
            try:
                summary = audit_release(model=model, probes=probes, release=release, limit=limit, settings=settings,
                                        name=name, thresholds=thresholds, replace=replace, run_id=run_id)
            except ReleaseRegression as exc:
                if timings:
                    exc.summary.timings = {**phases, **recorded_timings(exc.summary.flow_run_id)}
                raise
            if timings:
                summary.timings = {**phases, **recorded_timings(summary.flow_run_id)}
    except BaseException as exc:
        if not is_interrupt(exc):
            raise
        raise _interrupted(settings, run_id) from exc
    return summary


def _interrupted(settings: Settings, run_id: str) -> Interrupted:
    """After an interrupt: say how the run was recorded and what was kept."""
    with shielded():
        status = run_status(open_store(settings), run_id)
    if status is None:
        return Interrupted("interrupted before the run started: nothing was written")
    return Interrupted(
        f"interrupted: run {run_id} is recorded as {status} and its lease is released; every committed shard is "
        "kept, and rerunning the same command embeds only the rest (reusing the parts written but not committed)"
    )
