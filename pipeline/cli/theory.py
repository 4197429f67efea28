"""``normaudit theory``: the theory lab's commands (mounted on the main CLI as a sub-app).

Imports stay inside the commands (only typer at module level): ``normaudit sql`` must not pay for torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer

from flows.console import quiet_console  # sets environment only: imports no Prefect
from flows.interrupts import interruptible  # signal handling only: imports no Prefect

theory_app = typer.Typer(help="Theory lab: train small contrastive models, test the norm formula.",
                         no_args_is_help=True)


ConfigOpt = Annotated[Path | None, typer.Option(help="lab config, .yaml or .json (default: the default run)")]
RootOpt = Annotated[str | None, typer.Option("--root", help="storage root URL (default ./normaudit-data)")]


VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", help="also print Prefect's per-task log lines (always kept in the run logs) and the libraries' "
                      "own logs and progress bars")]


def _fail(message: str, code: int = 1) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def quiet_libraries(verbose: bool) -> None:
    """Unless ``verbose``, the libraries a theory command calls print nothing but errors; call before importing them.

    Through the settings each library documents, as environment variables (so the local Dask workers of
    ``theory run`` inherit them): tqdm's defaults (``TQDM_DISABLE``: the trainer's, the dataset's and the
    model card's "Computing widget examples" bars), transformers' and datasets' verbosity and progress bars,
    the hub's bars; sentence-transformers logs through the standard ``logging`` API. A value the user
    already set is kept. Our own progress bar (:mod:`pipeline.progress`) reports the work instead.
    """
    if verbose:
        return
    import logging

    for name, value in (("TQDM_DISABLE", "1"), ("TRANSFORMERS_VERBOSITY", "error"), ("DATASETS_VERBOSITY", "error"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(name, value)
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)


@theory_app.command("run")
@interruptible  # Ctrl-C or SIGTERM: the checkpoint audit under way records its end, exit 130
def run(
    config: ConfigOpt = None,
    root: RootOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Identity check, lr x batch x decay sweep, checkpoints audited as releases; prints the headline."""
    from pipeline.settings import load_settings
    from pipeline.theory.config import load_config

    try:
        cfg = load_config(config)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    settings = load_settings(root=root)
    quiet_console(verbose, local_cluster=not settings.dask_address)  # before Prefect and the workers start
    quiet_libraries(verbose)
    from flows.console import failures_once_on_console
    from flows.theory import run_theory_lab
    from pipeline.progress import RichStepProgress, use_step_progress

    failures_once_on_console()  # the error: line below is the one report of a failure

    t = time.perf_counter()
    try:
        with use_step_progress(RichStepProgress()):
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
    console.print(f"[bold]step identity[/] (docs/theory.md §2), max relative error per step: {errors}")
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


@theory_app.command("finetune")
@interruptible  # Ctrl-C or SIGTERM: the flow run records its end, exit 130
def finetune(
    model: Annotated[str, typer.Option(help="registry name or local sentence-transformers folder")] = "minilm-l6",
    steps: Annotated[int, typer.Option(help="optimizer steps")] = 150,
    batch_size: Annotated[int, typer.Option(help="definition -> lemma pairs per step (in-batch negatives)")] = 32,
    lr: Annotated[float | None, typer.Option(help="constant learning rate (default 5e-5 adamw, 5e-2 sgd)")] = None,
    optimizer: Annotated[str, typer.Option(help="adamw | sgd (plain SGD with weight decay, as the formula assumes)")
                         ] = "adamw",
    weight_decay: Annotated[float, typer.Option(help="weight decay lambda")] = 0.01,
    checkpoint_every: Annotated[int, typer.Option(help="save a checkpoint every K steps (and step 0, the last)")
                                ] = 30,
    trace_every: Annotated[int, typer.Option(help="trace the probe sample every s steps (1: what the formula needs)")
                           ] = 1,
    trace_nouns: Annotated[int, typer.Option(help="WordNet nouns in the traced sample")] = 120,
    trace_definitions: Annotated[int, typer.Option(help="test-split definitions in the traced sample")] = 60,
    max_seq_length: Annotated[int, typer.Option(help="tokens per text while training (and in the checkpoints)")
                              ] = 64,
    decay_norms: Annotated[bool, typer.Option(
        "--decay-norms", help="decay LayerNorm weights and biases too (default: exempt, as the trainer does)")
                           ] = False,
    shuffled_pairs: Annotated[bool, typer.Option(
        "--shuffled-pairs", help="control: definitions matched to a seeded permutation of the lemmas")] = False,
    seed: Annotated[int, typer.Option(help="training seed (batches, trace sample, the shuffle)")] = 0,
    run_label: Annotated[str | None, typer.Option("--run", help="run label (default MODEL-OPTIMIZER-sSEED)")] = None,
    out: Annotated[Path | None, typer.Option(help="checkpoint folder (default ./normaudit-checkpoints/RUN)")] = None,
    root: RootOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Fine-tune a model on the reverse dictionary's train split; checkpoints, a training trace, the formula."""
    started = time.perf_counter()
    from pydantic import ValidationError

    from pipeline.settings import load_settings
    from pipeline.theory.finetune import FinetuneConfig

    try:
        cfg = FinetuneConfig(model=model, steps=steps, batch_size=batch_size, learning_rate=lr, optimizer=optimizer,
                             weight_decay=weight_decay, checkpoint_every=checkpoint_every, trace_every=trace_every,
                             trace_nouns=trace_nouns, trace_definitions=trace_definitions, seed=seed,
                             max_seq_length=max_seq_length, decay_norms=decay_norms,
                             pairs="shuffled" if shuffled_pairs else "semantic",
                             run=run_label, out=str(out) if out else None)
        label = cfg.label()
    except (ValidationError, ValueError) as exc:
        _fail(f"invalid fine-tune options: {exc}")
    settings = load_settings(root=root)
    quiet_console(verbose, local_cluster=False)  # before Prefect starts
    quiet_libraries(verbose)
    from flows.console import failures_once_on_console
    from flows.finetune import run_finetune
    from pipeline.progress import RichStepProgress, use_step_progress

    failures_once_on_console()
    try:
        with use_step_progress(RichStepProgress()):
            summary = run_finetune(settings, cfg)
    except (ValueError, FileNotFoundError, FileExistsError, PermissionError, RuntimeError, LookupError) as exc:
        _fail(str(exc))
    _print_finetune(summary, label, time.perf_counter() - started)


@theory_app.command("formula")
def formula(
    run: Annotated[str, typer.Option("--run", help="a fine-tune run's label")],
    window_start: Annotated[int, typer.Option(help="first step of the window (its first half predicts)")] = 0,
    root: RootOpt = None,
) -> None:
    """Score the norm formula out of sample on a fine-tune run's stored training trace."""
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store
    from pipeline.theory.finetune import read_run
    from pipeline.theory.trace_formula import read_trace, score_formula

    store = open_store(load_settings(root=root))
    try:
        recorded = read_run(store, run)
        scores = score_formula(read_trace(store, run), recorded["weight_decay"], window_start)
    except (ValueError, FileNotFoundError, LookupError) as exc:
        _fail(str(exc))
    _print_formula(scores, f"{run} ({recorded['optimizer']}, lr {recorded['learning_rate']:g}, "
                           f"weight decay {recorded['weight_decay']:g})")


def _print_formula(scores: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if "error" in scores:
        console.print(f"formula not scored: {scores['error']}")
        return
    first, mid, last = scores["window"]
    table = Table(title=f"norm formula, {title}: steps {first}-{mid - 1} predict {mid}-{last} "
                        f"({scores['items']} items; lambda_eff median {scores['lambda_eff_median']:+.3g})")
    for col in ("target", "prediction", "R2", "R2 log", "Spearman", "predicted/observed"):
        table.add_column(col)
    for target in ("second_half", "final"):
        for name, s in scores[target].items():
            table.add_row(target, name, _fmt(s["r2"]), _fmt(s["r2_log"]), _fmt(s["spearman"]),
                          f"{s['ratio_median']:.3g}")
    console.print(table)


def trace_share_line(seconds: dict, wall: float, tokens: int) -> str:
    """The line that says what the trace cost: its seconds and share of the command's wall time."""
    return (f"trace: {seconds['trace']:.0f}s of {wall:.0f}s wall ({seconds['trace'] / wall:.0%}; "
            f"{tokens:,} padded tokens a traced step); training {seconds['train']:.0f}s, "
            f"checkpoints {seconds['checkpoints']:.0f}s, model load {seconds['load']:.0f}s")


def _print_finetune(summary: dict, label: str, wall: float) -> None:
    from rich.console import Console

    console = Console()
    decay = "every parameter" if summary["decay_norms"] else "LayerNorm weights and biases exempt"
    pairs = ", pairs shuffled (control)" if summary["pairs"] == "shuffled" else ""
    console.print(f"[bold]{label}[/]: {summary['steps']} steps of {summary['optimizer']} (lr {summary['lr']:g}, "
                  f"weight decay {summary['weight_decay']:g}: {decay}{pairs}) on "
                  f"{summary['split']['train_pairs']:,} train pairs; loss {summary['train_loss']:.3f}")
    console.print(trace_share_line(summary["seconds"], wall, summary["trace_tokens"]))
    console.print(f"checkpoints: {len(summary['checkpoints'])} in {summary['folder']}")
    console.print(f"trace: {summary['trace_rows']:,} rows; query it: normaudit sql --root {summary['root']} "
                  f"\"select step, kind, avg(norm) from training_trace where run = '{label}' group by all order by 1\"")
    _print_formula(summary["formula"], label)
    console.print("audit every checkpoint as a release: a `checkpoints:` entry in audits.yaml, then "
                  "`normaudit serve --config audits.yaml --once` (README, 'Theory lab and fine-tuning')")
