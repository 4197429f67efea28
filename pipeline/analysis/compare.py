"""Release-to-release comparison: which tracked statistics moved past their threshold beyond their noise.

A tracked statistic alerts when its change exceeds its threshold and, under ``require_significant`` (the
default), the paired bootstrap interval of the change (:func:`pipeline.analysis.paired.paired_comparison`,
computed by the caller on the items both releases embedded) excludes 0.
"""

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
    "previous_value": pl.Float64, "value": pl.Float64, "change": pl.Float64, "ci_low": pl.Float64,
    "ci_high": pl.Float64, "threshold": pl.Float64, "message": pl.String,
}
# Columns of the paired comparison (pipeline.analysis.paired) joined to a release comparison, renamed
PAIRED_COLUMNS = {"ci_low": "change_ci_low", "ci_high": "change_ci_high", "n_shared": "n_shared",
                  "verdict": "verdict"}
KEY = ["analysis", "probe_set", "property", "statistic"]


class AlertThresholds(BaseModel):
    """Largest tolerated absolute change of a statistic between two releases.

    ``per_statistic`` keys match, most specific first: ``analysis.statistic.property``,
    ``analysis.statistic``, then ``statistic`` (e.g. ``spearman: 0.05``,
    ``norm_vs_property.spearman.min_depth: 0.02``). Anything unmatched uses ``default``.
    ``require_significant`` (default true) also asks that the change's paired interval exclude 0; a
    statistic without a paired interval then needs the two releases' own intervals not to overlap (where
    both have one; else the threshold alone decides).
    """

    model_config = ConfigDict(extra="forbid")

    default: float = Field(0.1, ge=0)
    require_significant: bool = Field(
        True,
        description="alert only when the paired 95% interval of the change excludes 0 (false: threshold only)",
    )
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


def audited_release(con: duckdb.DuckDBPyConnection, model: str, release: str | None = None) -> tuple[str, str]:
    """(release, run_id) of ``model``'s finished audit of ``release`` (default: its latest).

    Raises:
        LookupError: no finished audit of it; the message lists the audited models or releases.
    """
    hist = release_history(con, model)
    if hist.height == 0:
        models = [r[0] for r in con.execute(
            "select distinct model from runs where status in ('completed', 'alerted') order by 1").fetchall()]
        raise LookupError(f"no finished audit of model {model!r} under this root; audited models: "
                          f"{models or 'none'}. Run `normaudit audit --model ...` first.")
    if release is None:
        last = hist.row(-1, named=True)
        return last["release"], last["run_id"]
    found = hist.filter(pl.col("release") == release)
    if found.height == 0:
        raise LookupError(f"no finished audit of {model} release {release!r}; audited releases of {model}: "
                          f"{hist['release'].to_list()}")
    return release, found["run_id"][0]


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
    previous: tuple[str, str] | None, thresholds: AlertThresholds, paired: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every shared statistic of ``run_id`` beside the previous release's; returns (comparison, alerts).

    ``paired`` is :func:`pipeline.analysis.paired.paired_comparison` of (model, previous release) against
    (model, release): its interval of each difference joins the comparison as ``change_ci_low`` and
    ``change_ci_high`` (null where it has none). The comparison gains ``threshold``, ``significant`` and
    ``alert``.
    """
    empty = pl.DataFrame(schema=ALERT_COLUMNS)
    if previous is None:
        return pl.DataFrame(), empty
    prev_release, prev_run = previous
    comparison = run_query(con, "compare_releases", current_run=run_id, previous_run=prev_run)
    if comparison.height == 0:
        return comparison, empty
    comparison = _with_paired(comparison, paired)
    comparison = comparison.with_columns(
        pl.struct(["analysis", "statistic", "property"]).map_elements(
            lambda r: thresholds.for_row(r["analysis"], r["statistic"], r["property"]), return_dtype=pl.Float64
        ).alias("threshold"),
        _significant().alias("significant"),
    )
    tracked = pl.Series([thresholds.tracks(a, st) for a, st in
                         zip(comparison["analysis"], comparison["statistic"], strict=True)], dtype=pl.Boolean)
    moved = pl.col("change").abs() > pl.col("threshold")
    rule = moved & pl.col("significant") if thresholds.require_significant else moved
    comparison = comparison.with_columns((rule & tracked).alias("alert"))
    alerts = comparison.filter(pl.col("alert")).with_columns(
        pl.lit(run_id).alias("run_id"), pl.lit(model).alias("model"), pl.lit(release).alias("release"),
        pl.lit(prev_release).alias("previous_release"),
    )
    alerts = alerts.with_columns(
        pl.Series("message", [_message(r) for r in alerts.iter_rows(named=True)], dtype=pl.String),
        # the alerts table's interval is the change's (docs/design.md), not the release's own
        pl.col("change_ci_low").alias("ci_low"), pl.col("change_ci_high").alias("ci_high"),
    ).select(list(ALERT_COLUMNS)).cast(ALERT_COLUMNS)
    return comparison, alerts


def _with_paired(comparison: pl.DataFrame, paired: pl.DataFrame | None) -> pl.DataFrame:
    """The comparison with the paired interval of each change (null columns where there is none)."""
    if paired is None or paired.height == 0:
        return comparison.with_columns(
            pl.lit(None, pl.Float64).alias("change_ci_low"), pl.lit(None, pl.Float64).alias("change_ci_high"),
            pl.lit(None, pl.Int64).alias("n_shared"), pl.lit(None, pl.String).alias("verdict"),
        )
    right = paired.select(*KEY, *PAIRED_COLUMNS).rename(PAIRED_COLUMNS).with_columns(
        pl.col("n_shared").cast(pl.Int64), pl.col("change_ci_low", "change_ci_high").cast(pl.Float64)
    )
    return comparison.join(right, on=KEY, how="left", nulls_equal=True)


def _significant() -> pl.Expr:
    """The paired interval excludes 0; without one, the two releases' own intervals do not overlap;
    without those either, true (the threshold alone decides)."""
    paired = (pl.col("change_ci_low") > 0) | (pl.col("change_ci_high") < 0)
    apart = (pl.col("ci_low") > pl.col("previous_ci_high")) | (pl.col("previous_ci_low") > pl.col("ci_high"))
    own = pl.col("ci_low").is_not_null() & pl.col("previous_ci_low").is_not_null()
    return (
        pl.when(pl.col("change_ci_low").is_not_null() & pl.col("change_ci_high").is_not_null()).then(paired)
        .when(own).then(apart)
        .otherwise(pl.lit(True))
    )


def interval_text(low: float | None, high: float | None) -> str:
    """``[+0.0123, +0.0456]``, or ``no interval``."""
    if low is None or high is None:
        return "no interval"
    return f"[{low:+.4f}, {high:+.4f}]"


def _message(r: dict) -> str:
    """An alert in words, naming both intervals: the change's paired one and the releases' own."""
    prop = r["property"] or "-"
    if r["change_ci_low"] is not None and r["change_ci_high"] is not None:
        paired = (f"paired 95% CI of the change {interval_text(r['change_ci_low'], r['change_ci_high'])} "
                  f"on {r['n_shared']:,} shared items")
    else:
        paired = "no paired interval of the change (the releases' own 95% CIs are compared)"
    return (
        f"{r['analysis']}.{r['statistic']} of {prop} on {r['probe_set']}: "
        f"{r['previous_value']:+.4f} {interval_text(r['previous_ci_low'], r['previous_ci_high'])} in "
        f"{r['previous_release']} -> {r['value']:+.4f} {interval_text(r['ci_low'], r['ci_high'])} in {r['release']} "
        f"(change {r['change']:+.4f}, {paired}; threshold {r['threshold']:g})"
    )


def write_alerts(store: Store, run_id: str, alerts: pl.DataFrame) -> None:
    """Store the run's alerts (an empty file is not written)."""
    if alerts.height:
        store.write_table(f"alerts/{run_id}.parquet", alerts.to_arrow())


class ReleaseRegression(RuntimeError):
    """A tracked statistic moved past its threshold: raised to end the flow run in a failed state."""
