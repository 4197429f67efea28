"""CLI command ``normaudit report``: render a release's HTML report from stored results.

Imports stay inside the command: the report's plots load matplotlib (seconds), which no other command needs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.cli.errors import VerboseOpt
from pipeline.cli.roots import require_store


def report(
    model: Annotated[str | None, typer.Option(help="model label as stored (e.g. minilm-l6)")] = None,
    release: Annotated[str | None, typer.Option(help="release label (default: the latest audited)")] = None,
    root: Annotated[str | None, typer.Option(help="storage root URL (default ./normaudit-data)")] = None,
    s3_endpoint_url: Annotated[
        str | None,
        typer.Option("--s3-endpoint-url", help="S3-compatible endpoint (default $AWS_ENDPOINT_URL)"),
    ] = None,
    models: Annotated[bool, typer.Option(
        "--models", help="write <root>/reports/index.html: every audited model and release side by side")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Write <root>/reports/<model>/<release>/index.html (plots beside it) and the model's release index;
    with --models, the page of every audited model and release instead."""
    from pipeline.analysis.report import render_report
    from pipeline.settings import load_settings
    from pipeline.storage.catalog import open_catalog, within_memory
    from pipeline.storage.store import open_store

    settings = load_settings(root=root, s3_endpoint_url=s3_endpoint_url)
    store = open_store(settings)
    require_store(store, root)  # reads a store: never creates one at a mistyped root
    if models:
        from pipeline.analysis.models_page import render_models_page

        typer.echo(render_models_page(store))
        return
    if model is None:
        typer.secho("error: give --model NAME (one model's report) or --models (every model's page)",
                    fg="red", err=True)
        raise typer.Exit(2)
    if release is None:
        rows = (
            open_catalog(store)
            .execute(
                "select release from runs where model = $model order by started_at desc limit 1",
                {"model": model},
            )
            .fetchall()
        )
        if not rows:
            typer.secho(
                f"error: no audit of model {model!r} under {store.root_url}; run `normaudit audit` first",
                fg="red",
                err=True,
            )
            raise typer.Exit(1)
        release = rows[0][0]
    try:  # DuckDB under the audit's budget, as in the audit's own report: left to its default (80% of the machine's
        # memory) it held 3.3 GiB for the report of 10 M items, 0.54 GiB under the audit's 256MB
        with within_memory(settings.analysis_memory, "the report"):
            url = render_report(store, model, release, memory_limit=settings.analysis_memory)
    except (LookupError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from exc
    typer.echo(url)
