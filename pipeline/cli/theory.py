"""``normaudit theory``: the theory lab's commands (mounted on the main CLI as a sub-app).

Imports stay inside the commands (only typer at module level): ``normaudit sql`` must not pay for torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.console import quiet_console  # sets environment only: imports no Prefect
from flows.interrupts import interruptible  # signal handling only: imports no Prefect

theory_app = typer.Typer(help="Theory lab: train small contrastive models, test the norm formula.",
                         no_args_is_help=True)


ConfigOpt = Annotated[Path | None, typer.Option(help="lab config, .yaml or .json (default: the default run)")]
RootOpt = Annotated[str | None, typer.Option("--root", help="storage root URL (default ./normaudit-data)")]


def _fail(message: str, code: int = 1) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@theory_app.command("run")
@interruptible  # Ctrl-C or SIGTERM: the checkpoint audit under way records its end, exit 130
def run(
    config: ConfigOpt = None,
    root: RootOpt = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="also print Prefect's per-task log lines (always kept in the run logs)")] = False,
) -> None:
    """Identity check, lr x batch x decay sweep, checkpoints audited as releases; prints the headline."""
    import time

    from pipeline.settings import load_settings
    from pipeline.theory.config import load_config

    try:
        cfg = load_config(config)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    settings = load_settings(root=root)
    quiet_console(verbose, local_cluster=not settings.dask_address)  # before Prefect and the workers start
    from flows.console import failures_once_on_console
    from flows.theory import run_theory_lab

    failures_once_on_console()  # the error: line below is the one report of a failure

    t = time.perf_counter()
    try:
        summary = run_theory_lab(settings, cfg)
    except (ValueError, FileNotFoundError, PermissionError, RuntimeError, LookupError) as exc:
        _fail(str(exc))
    summary["seconds"]["total"] = time.perf_counter() - t
    _print(summary)


def _fmt(value) -> str:
    return "—" if value is None else f"{value:+.3f}" if isinstance(value, float) else str(value)


def _print(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    errors = ", ".join(f"wd={k}: {v:.1e}" for k, v in summary["identity_max_rel_error"].items())
    console.print(f"[bold]step identity[/] (THEORY.md §2), max relative error per step: {errors}")
    table = Table(title="predicted vs observed norm (out of sample; medians over the sweep)")
    cols = ["r2", "spearman", "seed_r2", "seed_spearman", "persistence_spearman", "const_heat_spearman",
            "missing_over_heat"]
    table.add_column("model")
    for col in cols:
        table.add_column(col, justify="right")
    for kind, med in summary["median"].items():
        table.add_row(kind, *(_fmt(med[c]) for c in cols))
    console.print(table)
    table = Table(title=f"checkpoints of {summary['model']}: Spearman(norm, property) [95% CI]")
    for col in ("release", "property", "spearman", "CI", "n"):
        table.add_column(col)
    for row in summary["checkpoints"]:
        ci = "—" if row["ci_low"] is None else f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
        table.add_row(row["release"], row["property"], _fmt(row["value"]), ci, str(row["n"]))
    console.print(table)
    took = ", ".join(f"{k} {v:.0f}s" for k, v in summary["seconds"].items())
    console.print(f"time: {took}")
    console.print(f"data: {summary['root']}/{summary['folder']}")
    console.print(f"query it: normaudit sql --root {summary['root']} "
                  f"\"select * from '{summary['root']}/{summary['folder']}/sweep.parquet'\"")
