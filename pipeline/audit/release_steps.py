"""The audit's steps after its rows are committed: the analyses, the comparison with the previous release and the
report pages; flows/audit.py declares each as a Prefect task.

Each runs in a child process of the worker (:func:`pipeline.audit.child.run_in_child`): the analyses, the
comparison and the report read every item of the release, the pages import matplotlib, and a worker keeps what it
once allocated. In a child that memory goes back to the system when the step ends, and the worker, which may
embed the next release for hours, does not keep it. A child costs about a second to start.
"""

from __future__ import annotations

import polars as pl

from pipeline.analysis.audit_analyses import analyse_and_store
from pipeline.analysis.compare import ALERT_COLUMNS, AlertThresholds, compare_runs, previous_release, write_alerts
from pipeline.analysis.comparison_page import render_comparison_page
from pipeline.analysis.paired import paired_comparison, write_comparison
from pipeline.audit.child import run_in_child
from pipeline.audit.context import AuditContext
from pipeline.storage.catalog import open_catalog, within_memory


def run_analyses(ctx: AuditContext) -> pl.DataFrame:
    """Run the audit's analyses over committed data; store their ``results`` rows and the ``claims`` they decide.

    In a child process of the worker (:func:`pipeline.audit.child.run_in_child`), like the comparison and the
    report: they read every item of the release, and the worker that embeds would keep that memory."""
    return run_in_child(_analyse, ctx)


def _analyse(ctx: AuditContext) -> pl.DataFrame:
    with within_memory(limit := ctx.settings.analysis_memory, "the analyses"):
        return analyse_and_store(ctx.store, ctx.model, ctx.release, ctx.run_id, memory_limit=limit)


def compare_with_previous(ctx: AuditContext, thresholds: AlertThresholds) -> tuple[str | None, pl.DataFrame]:
    """Alerts for statistics that moved past their threshold since the previous release; stores them.

    With a previous release, the paired bootstrap of every statistic on the items both releases embedded
    runs first (only then: a first release costs nothing here); it is stored as this run's comparison
    (view ``comparisons``) with its page under ``reports/compare/``, and its intervals decide which moves
    are beyond noise (``thresholds.require_significant``). Returns ``(previous_release or None, alerts)``.
    In a child process of the worker, like :func:`run_analyses`."""
    return run_in_child(_compare, ctx, thresholds)


def _compare(ctx: AuditContext, thresholds: AlertThresholds) -> tuple[str | None, pl.DataFrame]:
    con = open_catalog(ctx.store, memory_limit=ctx.settings.analysis_memory)
    with within_memory(ctx.settings.analysis_memory, "the comparison with the previous release"), con:
        previous = previous_release(con, ctx.model, ctx.release)
        if previous is None:
            return None, pl.DataFrame(schema=ALERT_COLUMNS)
        base, other = (ctx.model, previous[0]), (ctx.model, ctx.release)
        paired = paired_comparison(con, base, other)
        _, alerts = compare_runs(con, ctx.model, ctx.release, ctx.run_id, previous, thresholds, paired)
    write_alerts(ctx.store, ctx.run_id, alerts)
    write_comparison(ctx.store, ctx.run_id, paired)
    render_comparison_page(ctx.store, paired, base, other, alerts["message"].to_list())
    return previous[0], alerts


def render_report(ctx: AuditContext) -> str:
    """Render the release's HTML report and the model's cross-release index; returns the report's URL. In a child
    process of the worker, like :func:`run_analyses` (its plots count every item on a grid)."""
    return run_in_child(_render_report, ctx)


def _render_report(ctx: AuditContext) -> str:
    from pipeline.analysis.report import render_report as render  # matplotlib: seconds to import

    with within_memory(ctx.settings.analysis_memory, "the report"):
        return render(ctx.store, ctx.model, ctx.release, memory_limit=ctx.settings.analysis_memory)


def render_models_page(ctx: AuditContext) -> str:
    """Render ``reports/index.html``: every audited model and release side by side; returns its URL. In a child
    process of the worker, like the report: matplotlib, once imported, would stay in the worker."""
    return run_in_child(_render_models_page, ctx)


def _render_models_page(ctx: AuditContext) -> str:
    from pipeline.analysis.models_page import render_models_page as render  # matplotlib: seconds to import

    return render(ctx.store)
