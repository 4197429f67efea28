"""Release-to-release comparison: which tracked statistics moved past their threshold."""

from __future__ import annotations

import fnmatch

import duckdb
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from pipeline.analysis.sql import run_query
from pipeline.storage.store import Store

ALERT_COLUMNS = {
    "run_id": pl.String, "analysis": pl.String, "model": pl.String, "release": pl.String,
    "previous_release": pl.String, "probe_set": pl.String, "property": pl.String, "statistic": pl.String,
    "previous_value": pl.Float64, "value": pl.Float64, "change": pl.Float64, "threshold": pl.Float64,
    "message": pl.String,
}


class AlertThresholds(BaseModel):
    """Largest tolerated absolute change of a statistic between two releases.

    ``per_statistic`` keys match, most specific first: ``analysis.statistic.property``,
    ``analysis.statistic``, then ``statistic`` (e.g. ``spearman: 0.05``,
    ``norm_vs_property.spearman.min_depth: 0.02``). Anything unmatched uses ``default``.
    """

    model_config = ConfigDict(extra="forbid")

    default: float = Field(0.1, ge=0)
    per_statistic: dict[str, float] = Field(default_factory=dict)
    # Descriptive rows (norm per bin, points of the selective-accuracy curve) are in norm or
    # accuracy units and move with any retraining; alerting on them would drown real signals.
    untracked: list[str] = Field(
        default_factory=lambda: ["norm_by_bin.*", "retrieval_calibration.coverage_*"],
        description="fnmatch patterns of analysis.statistic that are never alerted on",
    )

    def tracks(self, analysis: str, statistic: str) -> bool:
        """Whether changes of this statistic can raise an alert."""
        return not any(fnmatch.fnmatchcase(f"{analysis}.{statistic}", p) for p in self.untracked)

    def for_row(self, analysis: str, statistic: str, prop: str | None) -> float:
        for key in (f"{analysis}.{statistic}.{prop}", f"{analysis}.{statistic}", statistic):
            if key in self.per_statistic:
                return self.per_statistic[key]
        return self.default


def release_history(con: duckdb.DuckDBPyConnection, model: str) -> pl.DataFrame:
    """Releases of ``model`` in audit order with their latest finished run."""
    return run_query(con, "release_history", model=model)


def previous_release(con: duckdb.DuckDBPyConnection, model: str, release: str) -> tuple[str, str] | None:
    """(release, run_id) audited most recently before ``release`` (by start time), or None."""
    hist = release_history(con, model)
    if hist.height == 0:
        return None
    current = hist.filter(pl.col("release") == release)
    before = hist.filter(pl.col("release") != release)
    if current.height:
        before = before.filter(pl.col("started_at") < current["started_at"][0])
    if before.height == 0:
        return None
    last = before.row(-1, named=True)
    return last["release"], last["run_id"]


def compare_runs(
    con: duckdb.DuckDBPyConnection, model: str, release: str, run_id: str,
    previous: tuple[str, str] | None, thresholds: AlertThresholds,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every shared statistic of ``run_id`` beside the previous release's; returns (comparison, alerts)."""
    empty = pl.DataFrame(schema=ALERT_COLUMNS)
    if previous is None:
        return pl.DataFrame(), empty
    prev_release, prev_run = previous
    comparison = run_query(con, "compare_releases", current_run=run_id, previous_run=prev_run)
    if comparison.height == 0:
        return comparison, empty
    comparison = comparison.with_columns(
        pl.struct(["analysis", "statistic", "property"]).map_elements(
            lambda r: thresholds.for_row(r["analysis"], r["statistic"], r["property"]), return_dtype=pl.Float64
        ).alias("threshold")
    )
    tracked = pl.Series([thresholds.tracks(a, st) for a, st in
                         zip(comparison["analysis"], comparison["statistic"], strict=True)], dtype=pl.Boolean)
    moved = comparison.filter(tracked & (pl.col("change").abs() > pl.col("threshold")))
    alerts = moved.with_columns(
        pl.lit(run_id).alias("run_id"), pl.lit(model).alias("model"), pl.lit(release).alias("release"),
        pl.lit(prev_release).alias("previous_release"),
    )
    alerts = alerts.with_columns(
        pl.format(
            "{}.{} of {} on {}: {} in {} -> {} in {} (change {}, threshold {})",
            "analysis", "statistic", pl.col("property").fill_null("-"), "probe_set",
            pl.col("previous_value").round(4), "previous_release", pl.col("value").round(4), "release",
            pl.col("change").round(4), "threshold",
        ).alias("message")
    ).select(list(ALERT_COLUMNS)).cast(ALERT_COLUMNS)
    return comparison, alerts


def write_alerts(store: Store, run_id: str, alerts: pl.DataFrame) -> None:
    """Store the run's alerts (an empty file is not written)."""
    if alerts.height:
        store.write_table(f"alerts/{run_id}.parquet", alerts.to_arrow())


class ReleaseRegression(RuntimeError):
    """A tracked statistic moved past its threshold: raised to end the flow run in a failed state."""
