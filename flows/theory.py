"""The ``theory_lab`` flow: wiring only; every step lives in ``pipeline.theory.lab``.

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
from pipeline.settings import Settings, load_settings
from pipeline.theory import lab
from pipeline.theory.config import LabConfig
from pipeline.theory.world import build_world

# Training checkpoints are meant to move: an audit of one must never alert as a release regression.
NO_ALERTS = {"default": 1e9}


@task(cache_policy=NONE)
def prepare_run(settings: Settings, config: LabConfig):
    """Build the world, name the run's paths and store its config and probe file."""
    run = lab.plan_run(settings, config)
    world = build_world(config.world)
    lab.write_inputs(settings, run, world)
    return run, world


@task(cache_policy=NONE)
def check_identity(world, config: LabConfig):
    """Compare every row's step with THEORY.md section 2 (float64 table, SGD with and without decay)."""
    return lab.identity_table(world, config)


@task(cache_policy=NONE)
def train_point(world, run, pair):
    """Train both seeds of one sweep point and score them; the base run also saves checkpoints."""
    return lab.train_point(world, run, pair)


@task(cache_policy=NONE, retries=2, retry_delay_seconds=[1, 2])
def save_sweep(settings: Settings, run, points, identity):
    """Write the identity, sweep and item tables and the predicted-vs-observed plot."""
    return lab.save_sweep(settings, run, points, identity)


@task(cache_policy=NONE, retries=2, retry_delay_seconds=[1, 2])
def collect_checkpoints(settings: Settings, run, items):
    """Gather each audited checkpoint's norm-property relations (with CIs) into a table and a plot."""
    return lab.checkpoint_table(settings, run, items)


@task(cache_policy=NONE)
def summarize(settings: Settings, run, identity, sweep, checkpoints, seconds):
    """Store and return the run's headline numbers."""
    return lab.summarize(settings, run, identity, sweep, checkpoints, seconds)


@flow(name="theory_lab")
def theory_lab(config: dict | None = None, overrides: dict | None = None) -> dict:
    """Run the theory lab for ``config`` (a :class:`LabConfig` as a dict; defaults = the default run).

    ``overrides`` are non-secret settings (root, ...), as for ``audit_release``.
    """
    log = get_run_logger()
    cfg = LabConfig.model_validate(config or {})
    settings = load_settings(**(overrides or {}))
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    run, world = prepare_run(settings, cfg)
    identity = check_identity(world, cfg)
    seconds["identity"] = time.perf_counter() - t
    t = time.perf_counter()
    points = []
    for pair in cfg.grid():
        points.append(train_point(world, run, pair))
        log.info("%s: spearman %.3f, r2 %.3f (both seeds trained)", pair[0].label(),
                 points[-1][0][0]["spearman"], points[-1][0][0]["r2"])
    sweep, items, saved = save_sweep(settings, run, points, identity)
    seconds["sweep"] = time.perf_counter() - t
    t = time.perf_counter()
    if cfg.checkpoints.audit and saved:
        # one cluster for every checkpoint: its workers import torch once, not once per release
        with early_local_cluster(settings) as scheduler_address:
            audit_overrides = {"root": settings.root, "dask_address": scheduler_address()}
            for step in saved:
                log.info("auditing checkpoint %s of %s", run.release(step), run.model)
                run_audit(load_settings(**audit_overrides), run.checkpoint_path(step), [run.probe_url],
                          release=run.release(step), name=run.model, overrides=audit_overrides,
                          thresholds=NO_ALERTS)
    checkpoints = collect_checkpoints(settings, run, items)
    seconds["checkpoint_audits"] = time.perf_counter() - t
    return summarize(settings, run, identity, sweep, checkpoints, seconds)


def run_theory_lab(settings: Settings, config: LabConfig) -> dict:
    """Run :func:`theory_lab` in this process against one Prefect API (started here if needed)."""
    with prefect_api():
        return theory_lab(config=config.model_dump(mode="json"), overrides={"root": settings.root})
