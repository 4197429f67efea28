"""CLI commands for release tracking: ``normaudit compare`` and ``normaudit serve``.

Imports stay inside the commands, as in :mod:`pipeline.cli.main`: loading the CLI must not pay for Prefect,
DuckDB or rich (seconds on a small machine) before any command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.errors import VerboseOpt, one_line


def compare(
    model: Annotated[str, typer.Option(help="model label as stored (the 'other' side: differences are it - base)")],
    release: Annotated[str | None, typer.Option(help="its release (default: its latest finished audit)")] = None,
    against: Annotated[str | None, typer.Option(
        help="base model (default: --model itself, at the release audited before --release)")] = None,
    against_release: Annotated[str | None, typer.Option(
        help="base release (default: the base model's latest finished audit)")] = None,
    root: Annotated[str | None, typer.Option(help="storage root URL")] = None,
    threshold: Annotated[float | None, typer.Option(help="release form: default threshold on |change| (0.1)")] = None,
    require_significant: Annotated[bool, typer.Option(
        help="release form: alert only when the change's paired 95% interval excludes 0")] = True,
    resamples: Annotated[int, typer.Option(min=1, help="paired bootstrap resamples")] = 1000,
    seed: Annotated[int | None, typer.Option(
        min=0, max=2**32 - 1, help="paired bootstrap seed (default: the analyses' seed)")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Compare two audited (model, release) pairs on the units both embedded, with paired 95% intervals.

    Without --against (or --against-release) a release is compared with the one audited before it and
    the alerts it would raise are shown (exit 3 when any). The comparison is stored (view
    ``comparisons``) and written as a page under <root>/reports/compare/.
    """
    from pipeline.settings import load_settings
    from pipeline.storage.catalog import within_memory
    from pipeline.storage.store import open_store

    settings = load_settings(root=root)
    # DuckDB under the audit's budget (NORMAUDIT_ANALYSIS_MEMORY), as the audit's own comparison: it spills past it,
    # and what it cannot spill is said as that setting
    with within_memory(settings.analysis_memory, "the comparison"):
        _compare(open_store(settings), settings.analysis_memory, model, release, against, against_release, threshold,
                 require_significant, resamples, seed)


def _compare(store, memory: str, model: str, release: str | None, against: str | None, against_release: str | None,
             threshold: float | None, require_significant: bool, resamples: int, seed: int | None) -> None:
    """The comparison :func:`compare` describes, on ``store`` with DuckDB under ``memory``."""
    from rich.console import Console
    from rich.markup import escape

    from pipeline.analysis.compare import AlertThresholds, audited_release, compare_runs, previous_release
    from pipeline.analysis.comparison_page import render_comparison_page
    from pipeline.analysis.paired import paired_comparison, write_comparison
    from pipeline.progress import RichProgress, use_progress
    from pipeline.storage.catalog import open_catalog
    from pipeline.storage.runs import new_run_id

    con = open_catalog(store, memory_limit=memory)
    try:
        other_release, other_run = audited_release(con, model, release)
        if against is None and against_release is None:
            previous = previous_release(con, model, other_release)
            if previous is None:
                typer.echo(f"{model} {other_release} is the first audited release: nothing to compare with.")
                return
            base = (model, previous[0])
        else:
            base_model = against or model
            base = (base_model, audited_release(con, base_model, against_release)[0])
    except LookupError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    other = (model, other_release)
    params = {} if seed is None else {"seed": seed}
    try:  # a bar of its steps once it has run 2 s; it vanishes before the tables print
        with use_progress(RichProgress(transient=True, delay_s=2.0)):
            frame = paired_comparison(con, base, other, resamples=resamples, **params)
    except ValueError as exc:  # e.g. a finished run whose embeddings are not under this root
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    alerts = None
    if base[0] == other[0]:  # two releases of one model: the release thresholds apply
        thresholds = AlertThresholds(require_significant=require_significant,
                                     **({} if threshold is None else {"default": threshold}))
        base_run = audited_release(con, *base)[1]
        _, alert_rows = compare_runs(con, model, other_release, other_run, (base[1], base_run), thresholds, frame)
        alerts = alert_rows["message"].to_list()
    write_comparison(store, new_run_id(), frame)
    page = render_comparison_page(store, frame, base, other, alerts)
    # piped (a file, a test): wide enough for the table, as a terminal usually is; a terminal keeps its width
    console = Console() if sys.stdout.isatty() else Console(width=180)
    for table in _comparison_tables(frame, base, other):
        console.print(table)
    typer.echo(_one_side_counts(frame, base, other))  # echo: a path or a count is never wrapped
    for msg in alerts or []:
        console.print(f"[bold red]alert[/]: {escape(msg)}")
    typer.echo(f"page: {page}")
    if alerts:
        raise typer.Exit(3)


def _comparison_tables(frame, base: tuple[str, str], other: tuple[str, str]) -> list:
    """The comparison as rich tables, one per analysis; rows whose interval excludes 0 in bold."""
    from rich.table import Table

    b, o = "@".join(base), "@".join(other)

    def num(v) -> str:
        return "—" if v is None or v != v else f"{v:+.3f}"  # v != v: NaN

    tables = []
    for (analysis,), part in frame.group_by(["analysis"], maintain_order=True):
        table = Table(title=f"{analysis}: {o} against {b} (difference = {o} - {b}, on the units both embedded)",
                      title_justify="left")
        numeric = (b, o, "difference", "paired 95% CI", "n shared")
        for col in ("probe_set", "property", "statistic", *numeric, "verdict"):
            table.add_column(col, justify="right" if col in numeric else "left")
        for r in part.iter_rows(named=True):
            ci = "—" if r["ci_low"] is None or r["ci_high"] is None else f"[{num(r['ci_low'])}, {num(r['ci_high'])}]"
            table.add_row(r["probe_set"], r["property"] or "-", r["statistic"], num(r["base_value"]),
                          num(r["value"]), num(r["difference"]), ci, f"{int(r['n_shared'] or 0):,}", r["verdict"],
                          style="bold" if r["verdict"] == "differs" else None)
        tables.append(table)
    return tables


def _one_side_counts(frame, base: tuple[str, str], other: tuple[str, str]) -> str:
    """One line: per probe set, the units only one side embedded (never mixed into a statistic)."""
    from pipeline.analysis.comparison_page import only_one_side

    parts = [f"{r['probe_set']}: {r['n_shared']:,} shared, {r['n_only_base']:,} only in {'@'.join(base)}, "
             f"{r['n_only_other']:,} only in {'@'.join(other)}" for r in only_one_side(frame).iter_rows(named=True)]
    return "units embedded by one side only (left out): " + ("; ".join(parts) or "none compared")


def serve(
    config: Annotated[Path, typer.Option(help="audits.yaml: root, thresholds and the watched models")],
    root: Annotated[str | None, typer.Option(help="storage root URL (overrides the config's)")] = None,
    once: Annotated[bool, typer.Option(
        "--once", help="audit every watched model's new releases now, then exit (no schedule)")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="also print Prefect's per-task log lines (always kept in the run logs) and the traceback "
                          "of an unexpected failure")] = False,
) -> None:
    """Serve one cron-scheduled Prefect deployment per watched model (runs until stopped), or run them once."""
    from flows.console import quiet_console
    from pipeline.audit.watch import load_audits_config
    from pipeline.settings import load_settings

    try:
        cfg = load_audits_config(config)
    except ValueError as exc:  # on one line: a YAML error quotes the file over several
        typer.secho(f"error: {one_line(str(exc))}", fg="red", err=True)
        raise typer.Exit(1) from exc
    settings = load_settings(root=root or cfg.root)
    # before Prefect is imported: its logging is set up from the environment at import (the served runs'
    # processes inherit it too)
    quiet_console(verbose, local_cluster=not settings.dask_address)
    if once:
        _watch_once(cfg, settings)
        return
    from prefect import serve as prefect_serve

    from flows.watch import deployments

    typer.echo(f"serving {len(cfg.watch)} deployment(s) of watch_releases; results in {settings.root}")
    prefect_serve(*deployments(cfg, settings.root))


def _watch_once(cfg, settings) -> None:
    """Each watched model's ``watch_releases`` flow, now, in this process; exit 1 if any release alerted."""
    from flows.console import failures_once_on_console
    from flows.runners import prefect_api
    from flows.watch import watch_releases
    from pipeline.analysis.compare import ReleaseRegression
    from pipeline.progress import RichProgress, use_progress

    failures_once_on_console()  # the error: line is the one report of a failure
    alerts = []
    with prefect_api(), use_progress(RichProgress()):  # a line per release, a bar per probe set
        for w in cfg.watch:
            try:
                audited = watch_releases(watch=w, settings=settings, thresholds=w.thresholds or cfg.thresholds)
            except ReleaseRegression as exc:
                alerts.append(f"{w.name}: {exc}")
                continue
            typer.echo(f"{w.name}: audited {len(audited)} new release(s)" + (f": {', '.join(audited)}" if audited
                                                                                 else ""))
    typer.echo(f"results in {settings.root}; each model's releases and trends: "
               + ", ".join(f"{settings.root}/reports/{w.name}/index.html" for w in cfg.watch))
    if alerts:
        typer.secho("alerts:\n" + "\n".join(alerts), fg="red", err=True)
        raise typer.Exit(1)
