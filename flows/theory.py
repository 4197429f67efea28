"""The ``theory_lab`` flow: wiring only; every step is a function of ``pipeline.theory``, declared as a task here.

It reads like the lab's issue: build the world, check the step identity, train and score the sweep,
save the base encoder's checkpoints, audit each checkpoint as a release with ``audit_release`` on the
world's own probe set, then collect the per-checkpoint relations and the summary.
"""

from __future__ import annotations

import time

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.audit import run_audit
from flows.runners import early_local_cluster, prefect_api
from pipeline.analysis.compare import AlertThresholds
from pipeline.progress import step_reporter
from pipeline.settings import Settings, flow_settings
from pipeline.theory import lab
from pipeline.theory.config import LabConfig
from pipeline.theory.world import build_world as _build_world

# Training checkpoints are meant to move: an audit of one must never alert as a release regression.
NO_ALERTS = AlertThresholds(default=1e9)


def _task(fn, name: str | None = None):
    # cache_policy=NONE: inputs (settings, tensors) are never hashed; no retries: the store retries its own
    # transient errors, and training or scoring fails the same way twice
    return task(fn, name=name or fn.__name__, cache_policy=NONE)


plan_run = _task(lab.plan_run)
build_world = _task(_build_world, "build_world")
write_inputs = _task(lab.write_inputs)
check_identity = _task(lab.identity_table, "check_identity")
train_point = _task(lab.train_point)
save_sweep = _task(lab.save_sweep)
collect_checkpoints = _task(lab.checkpoint_table, "collect_checkpoints")
summarize = _task(lab.summarize)


@flow(name="theory_lab")
def theory_lab(config: LabConfig | None = None, settings: Settings | None = None) -> dict:
    """Run the theory lab for ``config`` (default: the default run).

    ``settings`` as for ``audit_release`` (recorded without credentials).
    """
    log = get_run_logger()
    cfg = config or LabConfig()
    settings = flow_settings(settings)
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    run = plan_run(settings, cfg)
    world = build_world(cfg.world)
    write_inputs(settings, run, world)
    identity = check_identity(world, cfg)
    seconds["identity"] = time.perf_counter() - t
    t = time.perf_counter()
    points, grid = [], list(cfg.grid())
    progress = step_reporter()  # the CLI's bar: each trained sweep point, then each audited checkpoint
    progress.start(f"theory lab {run.model}", len(grid), unit="runs")
    for pair in grid:
        points.append(train_point(world, run, pair))
        progress.update(len(points), stage=f"trained {pair[0].label()}")
        log.info("%s: spearman %.3f, r2 %.3f (both seeds trained)", pair[0].label(),
                 points[-1][0][0]["spearman"], points[-1][0][0]["r2"])
    sweep, items, saved = save_sweep(settings, run, points, identity)
    seconds["sweep"] = time.perf_counter() - t
    t = time.perf_counter()
    if cfg.checkpoints.audit and saved:
        progress.start(f"auditing {run.model}", len(saved), unit="checkpoints")
        # one cluster for every checkpoint: its workers import torch once, not once per release
        with early_local_cluster(settings) as scheduler_address:
            audit_settings = settings.model_copy(update={"dask_address": scheduler_address()})
            for done, step in enumerate(saved, 1):
                log.info("auditing checkpoint %s of %s", run.release(step), run.model)
                run_audit(audit_settings, run.checkpoint_path(step), [run.probe_url], release=run.release(step),
                          name=run.model, thresholds=NO_ALERTS)
                progress.update(done, stage=f"audited {run.release(step)}")
    progress.finish()
    checkpoints = collect_checkpoints(settings, run, items)
    seconds["checkpoint_audits"] = time.perf_counter() - t
    return summarize(settings, run, identity, sweep, checkpoints, seconds)


def run_theory_lab(settings: Settings, config: LabConfig) -> dict:
    """Run :func:`theory_lab` in this process against one Prefect API (started here if needed)."""
    with prefect_api():
        return theory_lab(config=config, settings=settings)
