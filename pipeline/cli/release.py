"""CLI commands for release tracking: ``normaudit compare`` and ``normaudit serve``.

Imports stay inside the commands, as in :mod:`pipeline.cli.main`: loading the CLI must not pay for Prefect,
DuckDB or rich (seconds on a small machine) before any command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def compare(
    model: Annotated[str, typer.Option(help="model label as stored")],
    release: Annotated[str, typer.Option(help="release to compare with the one audited before it")],
    root: Annotated[str | None, typer.Option(help="storage root URL")] = None,
    threshold: Annotated[float | None, typer.Option(help="default threshold on |change| (0.1)")] = None,
) -> None:
    """Show every statistic of a release beside the previous release's, and the alerts it would raise."""
    from rich.console import Console
    from rich.table import Table

    from pipeline.analysis.compare import AlertThresholds, compare_runs, previous_release, release_history
    from pipeline.settings import load_settings
    from pipeline.storage.catalog import open_catalog
    from pipeline.storage.store import open_store

    con = open_catalog(open_store(load_settings(root=root)))
    hist = release_history(con, model)
    current = hist.filter(hist["release"] == release)
    if current.height == 0:
        known = hist["release"].to_list()
        typer.secho(f"error: no finished audit of {model} release {release!r}; audited releases: {known}",
                    fg="red", err=True)
        raise typer.Exit(1)
    previous = previous_release(con, model, release)
    if previous is None:
        typer.echo(f"{model} {release} is the first audited release: nothing to compare with.")
        return
    thresholds = AlertThresholds(default=threshold) if threshold is not None else AlertThresholds()
    comparison, alerts = compare_runs(con, model, release, current["run_id"][0], previous, thresholds)
    table = Table(title=f"{model}: {previous[0]} -> {release}")
    for col in ("analysis", "probe_set", "property", "statistic", "previous", "current", "change", "threshold"):
        table.add_column(col, justify="right" if col in ("previous", "current", "change", "threshold") else "left")
    for r in comparison.iter_rows(named=True):
        moved = abs(r["change"]) > r["threshold"]
        style = "bold red" if moved else None
        table.add_row(r["analysis"], r["probe_set"], r["property"] or "-", r["statistic"],
                      f"{r['previous_value']:+.4f}", f"{r['value']:+.4f}", f"{r['change']:+.4f}",
                      f"{r['threshold']:.4f}", style=style)
    console = Console()
    console.print(table)
    for msg in alerts["message"].to_list():
        console.print(f"[bold red]alert[/]: {msg}")
    if alerts.height:
        raise typer.Exit(3)


def serve(
    config: Annotated[Path, typer.Option(help="audits.yaml: root, thresholds and the watched models")],
    root: Annotated[str | None, typer.Option(help="storage root URL (overrides the config's)")] = None,
) -> None:
    """Serve one cron-scheduled Prefect deployment per watched model (runs until stopped)."""
    from prefect import serve as prefect_serve

    from flows.watch import deployments
    from pipeline.audit.watch import load_audits_config
    from pipeline.settings import load_settings

    try:
        cfg = load_audits_config(config)
    except ValueError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    settings = load_settings(root=root or cfg.root)
    typer.echo(f"serving {len(cfg.watch)} deployment(s) of watch_releases; results in {settings.root}")
    prefect_serve(*deployments(cfg, settings.root))
