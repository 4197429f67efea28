"""The lab's steps as plain functions; flows/theory.py wires them into the ``theory_lab`` flow.

Outputs of a run (``<run>`` = config name + 8 hex of the config, so a rerun of the same config rewrites
the same files and re-audits nothing):

    <root>/theory/<run>/config.json                 the validated config
    <root>/theory/<run>/theory-world-<hash>.parquet the world's probe file (depth, log frequency, ambiguity)
    <root>/theory/<run>/identity.parquet            section 2 identity: max relative error per weight decay
    <root>/theory/<run>/sweep.parquet               one row per training run (scores, balance, relations)
    <root>/theory/<run>/items.parquet               one row per item per run (d, h, predicted, observed)
    <root>/theory/<run>/predicted_vs_observed.png
    <root>/theory/<run>/checkpoints.parquet         per checkpoint release: Spearman(norm, property) + CI
    <root>/theory/<run>/checkpoints.png
    <root>/theory/<run>/summary.json
    <checkpoint dir>/theory-<run>/step-XXXXXX/      the releases (a local folder: models load from disk)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.analysis.sql import run_query, sql_dir
from pipeline.settings import Settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store
from pipeline.theory.checkpoints import export_checkpoint, release_label
from pipeline.theory.config import LabConfig
from pipeline.theory.encoder import TrainConfig
from pipeline.theory.estimators import spearman
from pipeline.theory.identity import check_identity
from pipeline.theory.plots import checkpoint_trends, predicted_vs_observed
from pipeline.theory.sweep import PROPERTIES, run_pair
from pipeline.theory.world import World

__all__ = [
    "LabRun", "checkpoint_table", "identity_table", "plan_run", "save_sweep", "summarize", "train_point",
    "write_inputs",
]

# The same bootstrap size for every checkpoint, and a fixed seed, so reruns give the same intervals.
CI_RESAMPLES, CI_SEED = 1000, 0


@dataclass(frozen=True)
class LabRun:
    """Where one lab run reads and writes (all picklable strings)."""

    config: LabConfig
    root: str  # storage root URL
    folder: str  # run folder relative to the root: theory/<run>
    model: str  # model name of the checkpoints in the catalog: theory-<run>
    model_dir: str  # local folder holding the checkpoints (step-XXXXXX/)
    probe_set: str  # the world's probe set name
    probe_url: str  # the world's probe file (full URL)

    def release(self, step: int) -> str:
        """The release label of the checkpoint at ``step``."""
        return release_label(step)

    def checkpoint_path(self, step: int) -> str:
        """The checkpoint folder of ``step`` (what ``audit_release`` gets as its model)."""
        return str(Path(self.model_dir) / release_label(step))


def plan_run(settings: Settings, config: LabConfig) -> LabRun:
    """Name the run's folder, model, probe set and checkpoint folder (checkpoints need a local disk)."""
    store = open_store(settings)
    folder = f"theory/{config.run_name}"
    world_hash = hashlib.sha256(config.world.model_dump_json().encode()).hexdigest()[:8]
    probe_set = f"theory-world-{world_hash}"
    model = f"theory-{config.run_name}"
    if config.checkpoints.dir:
        base = Path(config.checkpoints.dir).expanduser()
    elif store.is_local:
        base = Path(store.path(folder, "checkpoints"))
    else:
        # a remote root cannot hold a model folder the loaders open from disk: keep the releases local
        base = Path("normaudit-theory") / config.run_name
    return LabRun(
        config=config, root=store.root_url, folder=folder, model=model,
        model_dir=str((base / model).resolve()), probe_set=probe_set,
        probe_url=store.url(folder, f"{probe_set}.parquet"),
    )


def write_inputs(settings: Settings, run: LabRun, world: World) -> None:
    """Store the validated config and the world's probe file (what the checkpoint audits embed)."""
    store = open_store(settings)
    store.write_bytes_atomic(f"{run.folder}/config.json", run.config.model_dump_json(indent=2).encode())
    store.write_table(f"{run.folder}/{run.probe_set}.parquet", world.probe_frame().to_arrow())


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with ``n`` torch threads: tiny matrices gain nothing from more, and lose a lot under contention."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def identity_table(world: World, config: LabConfig) -> pl.DataFrame:
    """docs/theory.md section 2 on a float64 table, once per configured weight decay."""
    with torch_threads(config.threads):
        results = [check_identity(world, config.identity, wd) for wd in config.identity.weight_decays]
    return pl.DataFrame([r.__dict__ for r in results])


def train_point(
    world: World, run: LabRun, pair: tuple[TrainConfig, TrainConfig]
) -> tuple[list[dict], pl.DataFrame, list[int]]:
    """Train and score one grid point (both seeds); save checkpoints if it is the base encoder run.

    Returns the two results rows, the per-item frame and the checkpoint steps saved (maybe none).
    """
    steps: tuple[int, ...] = ()
    saved: list[int] = []

    def save(step: int, model) -> None:
        export_checkpoint(model, world.tokens, run.model_dir, step)
        saved.append(step)

    if pair[0] == run.config.base_run():
        steps = run.config.checkpoint_steps()
    with torch_threads(run.config.threads):
        rows, items = run_pair(world, pair, steps, save if steps else None)
    return rows, items, saved


def save_sweep(settings: Settings, run: LabRun, points: list[tuple[list[dict], pl.DataFrame, list[int]]],
               identity: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, list[int]]:
    """Write identity, sweep and items tables and the predicted-vs-observed plot.

    ``points`` are :func:`train_point` outputs. Returns the sweep table, the item table and the saved
    checkpoint steps.
    """
    store = open_store(settings)
    rows = [row for point in points for row in point[0]]
    items = pl.concat([point[1] for point in points])
    saved = sorted({step for point in points for step in point[2]})
    sweep = pl.DataFrame(rows).with_columns(pl.lit(run.config.run_name).alias("run"))
    sweep = sweep.select(["run", *[c for c in sweep.columns if c != "run"]])
    store.write_table(f"{run.folder}/identity.parquet", identity.to_arrow())
    store.write_table(f"{run.folder}/sweep.parquet", sweep.to_arrow())
    store.write_table(f"{run.folder}/items.parquet", items.to_arrow())
    store.write_bytes_atomic(f"{run.folder}/predicted_vs_observed.png", predicted_vs_observed(items, sweep))
    return sweep, items, saved


def _ci_fill(con, frame: pl.DataFrame, model: str) -> pl.DataFrame:
    """Fill missing CIs from ``sql/norm_vs_property_ci.sql`` (the bootstrap real audits use), if present."""
    has_ci_sql = (sql_dir() / "norm_vs_property_ci.sql").is_file()
    if frame.height == 0 or frame["ci_low"].null_count() == 0 or not has_ci_sql:
        return frame
    cis = pl.concat([
        run_query(con, "norm_vs_property_ci", model=model, release=release, resamples=CI_RESAMPLES,
                  seed=CI_SEED)
        .select("release", "probe_set", "property", "statistic",
                pl.col("ci_low").alias("boot_low"), pl.col("ci_high").alias("boot_high"))
        for release in frame["release"].unique().to_list()
    ])
    return (frame.join(cis, on=["release", "probe_set", "property", "statistic"], how="left")
            .with_columns(pl.coalesce("ci_low", "boot_low").alias("ci_low"),
                          pl.coalesce("ci_high", "boot_high").alias("ci_high"))
            .drop("boot_low", "boot_high"))


def checkpoint_table(settings: Settings, run: LabRun, items: pl.DataFrame) -> pl.DataFrame:
    """Per audited checkpoint: Spearman(norm, depth / log_frequency / ambiguity) with CI, from ``results``.

    Writes ``checkpoints.parquet`` and ``checkpoints.png``; the plot's dashed levels are the relations the
    base run's *predicted* norms imply (docs/theory.md section 5, item 3).
    """
    store = open_store(settings)
    con = open_catalog(store)
    frame = run_query(con, "theory_checkpoints", model=run.model, probe_set=run.probe_set)
    frame = _ci_fill(con, frame, run.model)
    frame = frame.filter(pl.col("property").is_in(PROPERTIES)).with_columns(
        pl.col("release").str.extract(r"(\d+)$").cast(pl.Int64).alias("step"),
        pl.lit(run.model).alias("model"), pl.lit(run.config.run_name).alias("run"),
    ).sort("step", "property", "statistic")
    base = items.filter(pl.col("label") == run.config.base_run().label())
    # what the base run's predicted norms imply: the level the audited relations should reach
    implied = {p: spearman(base["predicted_norm"].to_numpy(), base[p].to_numpy()) for p in PROPERTIES}
    store.write_table(f"{run.folder}/checkpoints.parquet", frame.to_arrow())
    spearman_rows = frame.filter(pl.col("statistic") == "spearman")
    store.write_bytes_atomic(f"{run.folder}/checkpoints.png", checkpoint_trends(spearman_rows, implied))
    return frame


def summarize(settings: Settings, run: LabRun, identity: pl.DataFrame, sweep: pl.DataFrame,
              checkpoints: pl.DataFrame, seconds: dict[str, float]) -> dict:
    """The headline numbers of the run as a dict, also stored as ``summary.json``."""
    def median(kind: str, col: str) -> float:
        sub = sweep.filter(pl.col("kind") == kind)[col].drop_nans().drop_nulls()
        return float(sub.median()) if sub.len() else float("nan")

    cols = ["r2", "spearman", "seed_r2", "seed_spearman", "persistence_spearman", "heat_only_spearman",
            "const_heat_r2", "const_heat_spearman", "missing_over_heat", "lambda_eff_over_lambda",
            "lambda_eff_decay_over_lambda", "lambda_eff_gradient_over_lambda"]
    base = sweep.filter(pl.col("label") == run.config.base_run().label()).row(0, named=True)
    out = {
        "run": run.config.run_name, "root": run.root, "folder": run.folder, "model": run.model,
        "probe_set": run.probe_set, "n_runs": sweep.height,
        "identity_max_rel_error": dict(zip(identity["weight_decay"].cast(str), identity["max_rel_error"],
                                           strict=True)),
        "median": {kind: {c: median(kind, c) for c in cols} for kind in ("table", "encoder")},
        "base_run": {k: base[k] for k in ("label", *cols, "mean_norm_observed", "mean_norm_predicted")},
        "checkpoints": checkpoints.filter(pl.col("statistic") == "spearman")
        .select("release", "property", "value", "ci_low", "ci_high", "n").to_dicts(),
        "seconds": seconds,
    }
    out = json.loads(json.dumps(out, default=float).replace("NaN", "null"))
    open_store(settings).write_bytes_atomic(f"{run.folder}/summary.json", json.dumps(out, indent=2).encode())
    return out
