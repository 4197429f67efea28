"""Scheduled release audits: ``watch_releases`` finds new releases of a watched model and audits each.

``normaudit serve --config audits.yaml`` serves one deployment of this flow per watched
model, on its cron schedule (``flow.serve``/``prefect.serve``); ``prefect.yaml`` declares
the same for a work pool.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows import tasks
from flows.audit import audit_release
from pipeline.analysis.compare import ReleaseRegression
from pipeline.audit.watch import AuditsConfig, WatchedModel
from pipeline.settings import load_settings


@flow(name="watch_releases")
def watch_releases(watch: dict, overrides: dict | None = None, thresholds: dict | None = None) -> list[str]:
    """Audit every release of ``watch`` not audited yet, oldest first; fail if any regressed.

    Every new release is audited even when an earlier one raised an alert; the flow run
    then ends failed with all alert messages.
    """
    log = get_run_logger()
    watched = WatchedModel.model_validate(watch)
    settings = load_settings(**(overrides or {}))
    releases = tasks.find_new_releases(settings, watched)
    log.info("%s: %d new release(s): %s", watched.name, len(releases), [r for r, _ in releases])
    regressions = []
    for label, ref in releases:
        try:
            audit_release(model=ref, probes=watched.probes, release=label, limit=watched.limit,
                          overrides=overrides or {}, name=watched.name, thresholds=thresholds)
        except ReleaseRegression as exc:
            regressions.append(str(exc))
    if regressions:
        raise ReleaseRegression(" | ".join(regressions))
    return [label for label, _ in releases]


def deployments(config: AuditsConfig, overrides: dict | None = None) -> list:
    """One cron-scheduled deployment of :func:`watch_releases` per watched model."""
    out = []
    for w in config.watch:
        thresholds = (w.thresholds or config.thresholds).model_dump()
        out.append(watch_releases.to_deployment(
            name=w.name, cron=w.cron,
            parameters={"watch": w.model_dump(), "overrides": overrides or {}, "thresholds": thresholds},
            description=f"Audit new releases of {w.name} and compare each with the previous one.",
        ))
    return out
