"""Audit flows: wiring only; every step lives in ``pipeline`` and is wrapped in flows/tasks.py.

``audit_release`` reads like DESIGN.md's "flow of one audit": resolve the model,
register the run, embed the probe sets on Dask (``embed_probes``), run the SQL
analyses (``run_analyses``), compare with the previous release
(``compare_releases``), render the report, and fail loudly on a regression.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from dataclasses import dataclass, field

import dask
from prefect import flow, get_run_logger
from prefect.futures import as_completed

from flows import tasks
from flows.interrupts import Interrupted, interrupt_signal, is_interrupt, shielded
from flows.runners import api_lost, dask_runner, early_local_cluster, gpu_annotation, prefect_api
from pipeline.analysis.compare import AlertThresholds, ReleaseRegression
from pipeline.audit.steps import embedding_params, manifest_template
from pipeline.progress import reporter
from pipeline.quality.suites import warm_gates
from pipeline.settings import Settings, load_settings
from pipeline.storage.runs import RunRecord, new_run_id, run_status
from pipeline.storage.store import open_store

# How an audit that stopped early is recorded in ``runs``.
INTERRUPTED, FAILED = "interrupted", "failed"


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
    alerts: object = None
    previous_release: str | None = None
    report: str | None = None
    timings: dict = field(default_factory=dict)


def _add(timings: dict, more: dict) -> None:
    for k, v in more.items():
        timings[k] = timings.get(k, 0.0) + v


@flow(name="embed_probes")
def embed_probes(
    model: str, probes: list[str], release: str, run_id: str, resolved, limit: int | None = None,
    overrides: dict | None = None, replace: bool = False,
) -> dict:
    """Embed probe sets shard by shard on the Dask task runner; commit each shard as it validates."""
    log = get_run_logger()
    settings = load_settings(**(overrides or {}))
    out = {"embedded": {}, "skipped": {}, "timings": {}}
    with gpu_annotation():
        # submitted first, so an idle worker loads the model and computes these while the probe sets load
        # here; at a lower priority, so a worker that joins later takes the first shard before them
        with dask.annotate(priority=-1):
            token_norms = tasks.compute_token_norms.submit(settings, resolved, model, release)
        for spec in probes:
            ps = tasks.load_probes(settings, spec, run_id, replace)
            todo, skipped = tasks.plan_shards(settings, ps, model, release, resolved, limit)
            out["skipped"][ps.name] = skipped
            log.info("%s: %d shards to embed, %d already committed", ps.name, len(todo), skipped)
            template = manifest_template(model, release, ps.name, resolved, settings)
            futures = {tasks.embed_shard.submit(settings, resolved, model, release, s, run_id): s for s in todo}
            progress = reporter()
            progress.start(ps.name, len(todo), sum(s.size for s in todo))
            embedded = 0
            for fut in as_completed(list(futures)):
                part = _shard_result(fut, futures[fut])
                rows, seconds = tasks.validate_and_commit(settings, part, futures[fut], template, run_id)
                _add(out["timings"], part.timings | {"storage": part.timings["storage"] + seconds["storage"],
                                                      "validation": seconds["validation"]})
                embedded += rows
                progress.advance(rows)
            progress.finish()
            out["embedded"][ps.name] = embedded
    tasks.commit_token_norms(settings, token_norms.result(), model, release, run_id)
    return out


def _shard_result(fut, shard):
    """The staged part of a shard; a shard no worker could take (Dask's no-workers-timeout) is named."""
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


@flow(name="run_analyses")
def analyses_flow(model: str, release: str, run_id: str, overrides: dict | None = None):
    """Run the SQL analyses over committed data and store their results."""
    return tasks.run_analyses(load_settings(**(overrides or {})), model, release, run_id)


@flow(name="compare_releases")
def compare_flow(model: str, release: str, run_id: str, thresholds: dict | None = None,
                 overrides: dict | None = None):
    """Compare the run's statistics with the previous release; store and return alerts."""
    settings = load_settings(**(overrides or {}))
    return tasks.compare_with_previous(settings, model, release, run_id, AlertThresholds(**(thresholds or {})))


@flow(name="audit_release")
def audit_release(
    model: str,
    probes: list[str],
    release: str | None = None,
    limit: int | None = None,
    overrides: dict | None = None,
    name: str | None = None,
    thresholds: dict | None = None,
    replace: bool = False,
    run_id: str | None = None,
) -> AuditSummary:
    """Audit one model release end to end; fail the run when a statistic regressed past its threshold.

    ``overrides`` are non-secret settings (root, batch sizes, ...); credentials are read from
    the environment by :mod:`pipeline.settings` and never pass through flow parameters.
    ``name`` labels the model in storage (default: the registry name or directory name).
    ``replace`` lets a probe file replace a stored probe set of the same name (else that is refused).
    ``run_id`` (default: a new one) lets the caller clean up after the run if it is interrupted.

    However the run ends (completed, alerted, failed, interrupted by Ctrl-C or SIGTERM), its
    lease is released, its end is recorded and its uncommitted staging is removed, and no
    second signal can cut that short (:func:`flows.interrupts.shielded`).
    """
    settings = load_settings(**(overrides or {}))
    timings: dict[str, float] = {}
    t = time.perf_counter()
    open_store(settings).check_writable()
    resolved = tasks.resolve_model(model)
    timings["resolve_model"] = time.perf_counter() - t
    model_name = name or resolved.spec.name
    release = release or resolved.fingerprint[:12]
    run = RunRecord(
        run_id=run_id or new_run_id(), model=model_name, release=release, fingerprint=resolved.fingerprint,
        probe_set=",".join(probes),
        params={**embedding_params(resolved, settings), "limit": limit, "shard_size": settings.shard_size,
                "batch_tokens": settings.batch_tokens, "device": settings.device},
    )
    summary = AuditSummary(run.run_id, model_name, release, resolved.fingerprint, open_store(settings).root_url)
    try:
        # inside: an interrupt while the record is written (its liveness marker first) is recorded too
        tasks.register_run(settings, run)
        for abandoned in tasks.sweep_abandoned_runs(settings):  # runs a SIGKILL or a crash ended unrecorded
            get_run_logger().warning("abandoned %s: recorded as abandoned, its staging removed", abandoned)
        tasks.open_release(settings, model_name, release, run.run_id)  # one audit per release at a time
        t = time.perf_counter()
        embedded = embed_probes.with_options(task_runner=dask_runner(settings))(
            model_name, probes, release, run.run_id, resolved, limit, overrides, replace)
        summary.embedded_items, summary.skipped_shards = embedded["embedded"], embedded["skipped"]
        _add(timings, embedded["timings"])
        timings["embed_flow_total"] = time.perf_counter() - t
        t = time.perf_counter()
        # tasks here rather than the standalone subflows: a subflow costs about a second of API calls
        summary.results = tasks.run_analyses(settings, model_name, release, run.run_id)
        timings["analyses"] = time.perf_counter() - t
        t = time.perf_counter()
        summary.previous_release, summary.alerts = tasks.compare_with_previous(
            settings, model_name, release, run.run_id, AlertThresholds(**(thresholds or {})))
        timings["compare"] = time.perf_counter() - t
        run.status = "alerted" if summary.alerts.height else "completed"
        tasks.clean_staging(settings, run.run_id)
    except BaseException as exc:
        if is_interrupt(exc) and api_lost():  # stopped by the API watch of flows.runners.prefect_api
            run.status, run.message = INTERRUPTED, f"stopped: {api_lost()}"
        elif is_interrupt(exc):
            run.status, run.message = INTERRUPTED, f"interrupted by {_signal_name(exc)}"
        else:
            run.status, run.message = FAILED, f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        with shielded():  # a second Ctrl-C waits for this: the lease and the run's end are always recorded
            _record_end(settings, model_name, release, run, timings)
    t = time.perf_counter()
    summary.report = tasks.render_report(settings, model_name, release)  # after the run record: it shows it
    timings["report"] = time.perf_counter() - t
    summary.timings = timings
    if summary.alerts.height:
        exc = ReleaseRegression(
            f"{summary.alerts.height} statistic(s) of {model_name} moved past their threshold since release "
            f"{summary.previous_release}: " + "; ".join(summary.alerts["message"].to_list()[:5])
        )
        exc.summary = summary  # the audit itself is committed; callers may still show it
        raise exc
    return summary


def _signal_name(exc: BaseException) -> str:
    signum = getattr(exc, "signal", None)  # Prefect's TerminationSignal carries it
    if signum is not None:
        return signal.Signals(signum).name
    # the CLI's handler noted the signal; ``exc`` may be a library's error wrapped around the interrupt
    return interrupt_signal() or (str(exc) if isinstance(exc, KeyboardInterrupt) else "") or "SIGINT (Ctrl-C)"


def _record_end(settings: Settings, model: str, release: str, run: RunRecord, timings: dict) -> None:
    """Give the lease back (Data Docs built), drop uncommitted staging, and record how the run ended.

    After an interrupt the plain functions run, not tasks: the stop must not wait on the Prefect API
    (a service manager's SIGTERM may have stopped it too), and the Data Docs are skipped.
    """
    interrupted = run.status == INTERRUPTED
    step = (lambda t: t.fn) if interrupted else (lambda t: t)
    if run.status in (FAILED, INTERRUPTED):  # parts never committed are never used: a rerun embeds them again
        step(tasks.clean_staging)(settings, run.run_id)
    step(tasks.close_release)(settings, model, release, run.run_id, data_docs=not interrupted)
    run.finished_at, run.timings = dt.datetime.now(dt.UTC), timings
    step(tasks.register_run)(settings, run)


def run_audit(settings: Settings, model: str, probes: list[str], release: str | None = None,
              limit: int | None = None, overrides: dict | None = None, name: str | None = None,
              thresholds: dict | None = None, replace: bool = False) -> AuditSummary:
    """Run :func:`audit_release` in this process against one Prefect API (started here if needed).

    The local Dask cluster (when no scheduler address is set) starts while the API boots.
    Ctrl-C or SIGTERM ends it with :class:`~flows.interrupts.Interrupted` once the run has
    recorded its end and the local workers are stopped.
    """
    overrides = dict(overrides or {})
    run_id = new_run_id()
    t = time.perf_counter()
    try:
        with early_local_cluster(settings) as scheduler_address, prefect_api(while_booting=warm_gates):
            api_start = time.perf_counter() - t
            overrides["dask_address"] = scheduler_address()
            cluster_wait = time.perf_counter() - t - api_start
            summary = audit_release(model=model, probes=probes, release=release, limit=limit, overrides=overrides,
                                    name=name, thresholds=thresholds, replace=replace, run_id=run_id)
    except BaseException as exc:
        if not is_interrupt(exc):
            raise
        raise _interrupted(settings, run_id) from exc
    summary.timings = {"api_start": api_start, "cluster_start_after_api": cluster_wait, **summary.timings}
    return summary


def _interrupted(settings: Settings, run_id: str) -> Interrupted:
    """After an interrupt: remove what a worker staged after the flow's cleanup; say what was kept."""
    with shielded():
        store = open_store(settings)
        # a worker that was mid-shard may have staged its part after the flow removed the folder; the
        # local workers are stopped now (an external cluster's stragglers go at the next audit's sweep)
        store.rm(f"staging/{run_id}", recursive=True)
        status = run_status(store, run_id)
    if status is None:
        return Interrupted("interrupted before the run started: nothing was written")
    return Interrupted(
        f"interrupted: run {run_id} is recorded as {status}, its lease is released and its staging removed; "
        "every committed shard is kept, and rerunning the same command embeds only the rest"
    )
