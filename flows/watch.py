"""Scheduled release audits: ``watch_releases`` finds new releases of a watched model and audits each.

``normaudit serve --config audits.yaml`` serves one deployment of this flow per watched
model, on its cron schedule (``flow.serve``/``prefect.serve``); ``prefect.yaml`` declares
the same for a work pool.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.audit import audit_release
from pipeline.analysis.compare import AlertThresholds, ReleaseRegression
from pipeline.audit import steps
from pipeline.audit.watch import AuditsConfig, WatchedModel
from pipeline.progress import reporter
from pipeline.settings import Settings, flow_settings

# cache_policy=NONE: the settings must never be hashed; no retries: the store retries transient errors itself
find_new_releases = task(steps.find_new_releases, cache_policy=NONE)


@flow(name="watch_releases")
def watch_releases(watch: WatchedModel, settings: Settings | None = None,
                   thresholds: AlertThresholds | None = None) -> list[str]:
    """Audit every release of ``watch`` not audited yet, oldest first; fail if any regressed.

    Every new release is audited even when an earlier one raised an alert; the flow run
    then ends failed with all alert messages. ``settings`` as for ``audit_release`` (no credentials).
    """
    log = get_run_logger()
    settings = flow_settings(settings)
    releases = find_new_releases(settings, watch)
    log.info("%s: %d new release(s): %s", watch.name, len(releases), [r for r, _ in releases])
    regressions = []
    for i, (label, ref) in enumerate(releases, 1):
        reporter().section(f"{watch.name}: auditing release {label} ({i} of {len(releases)})")
        try:
            audit_release(model=ref, probes=watch.probes, release=label, limit=watch.limit,
                          settings=settings, name=watch.name, thresholds=thresholds)
        except ReleaseRegression as exc:
            regressions.append(str(exc))
    if regressions:
        raise ReleaseRegression(" | ".join(regressions))
    return [label for label, _ in releases]


def deployments(config: AuditsConfig, root: str) -> list:
    """One cron-scheduled deployment of :func:`watch_releases` per watched model, writing under ``root``.

    A deployment's parameters are JSON that Prefect records: its settings name the root only; every other
    setting, credentials included, is read from the environment of the process that runs it.
    """
    out = []
    for w in config.watch:
        out.append(watch_releases.to_deployment(
            name=w.name, cron=w.cron,
            parameters={"watch": w.model_dump(mode="json"), "settings": {"root": root},
                        "thresholds": (w.thresholds or config.thresholds).model_dump(mode="json")},
            description=f"Audit new releases of {w.name} and compare each with the previous one.",
        ))
    return out
