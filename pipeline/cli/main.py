"""The ``normaudit`` command line (typer). Heavy imports stay inside commands so `sql` starts fast."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from flows.console import quiet_console  # sets environment only: imports no Prefect
from flows.interrupts import interruptible  # signal handling only: imports no Prefect
from pipeline.cli.errors import ReportingGroup, VerboseOpt  # imports only typer and click
from pipeline.cli.output import OutputFormat, printable, write_output  # imports only typer
from pipeline.cli.roots import require_store  # imports only typer
from pipeline.cli.theory import theory_app  # a sub-app: imports only typer

# Great Expectations logs every ephemeral docs folder it creates at INFO: noise in a terminal.
logging.getLogger("great_expectations").setLevel(logging.WARNING)

# ReportingGroup: an exception that escapes any command (a library's, a bug) is one error: line, its traceback
# in a log file (pipeline/cli/errors.py); the sub-apps get the same class, so `theory` and `probes` are covered.
app = typer.Typer(help="Audit what the discarded norm of contrastive embeddings encodes.", no_args_is_help=True,
                  cls=ReportingGroup)
probes_app = typer.Typer(help="Probe sets: add, list, build.", no_args_is_help=True, cls=ReportingGroup)
app.add_typer(probes_app, name="probes")
app.add_typer(theory_app, name="theory", cls=ReportingGroup)


def _register_commands() -> None:
    """The commands defined in modules of their own: release tracking, quality, the report."""
    from pipeline.cli.release import compare, serve
    from pipeline.cli.report import report
    from pipeline.cli.verify import verify

    for command in (compare, serve, verify, report):
        app.command()(command)


_register_commands()

RootOpt = Annotated[
    str | None, typer.Option("--root", help="storage root URL (default ./normaudit-data or $NORMAUDIT_ROOT)")
]
EndpointOpt = Annotated[
    str | None, typer.Option("--s3-endpoint-url", help="S3-compatible endpoint (default $AWS_ENDPOINT_URL)")
]


def _say(level: str, message: str) -> None:
    """A ``note:`` or ``warning:`` line on stderr (what was chosen for the user, or what looks wrong)."""
    typer.secho(f"{level}: {message}", fg=typer.colors.YELLOW if level == "warning" else None, err=True)


def _fail(message: str, code: int = 1) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.command()
@interruptible  # Ctrl-C or SIGTERM at any phase: the run records its end, exit 130
def audit(
    model: Annotated[
        str, typer.Option(help="registry name (e.g. minilm-l6), a model directory, or hf:ORG/NAME[@REV]")
    ],
    probes: Annotated[list[str], typer.Option(help="probe set name or probe file; repeat for several")],
    release: Annotated[
        str | None, typer.Option(help="release label (default: 12 hex of the fingerprint, -PRECISION unless float32)")
    ] = None,
    root: RootOpt = None,
    limit: Annotated[int | None, typer.Option(min=1, help="first N items of each probe set, stable order")] = None,
    dask_address: Annotated[str | None, typer.Option(help="Dask scheduler address (default: local processes)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="local Dask worker processes")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or mps")] = None,
    vector_dtype: Annotated[str | None, typer.Option(help="stored vector dtype: float32 or float16")] = None,
    precision: Annotated[str | None, typer.Option(
        help="dtype the model runs in: float32 (default), bfloat16 or float16 (GPUs); a reduced precision is "
             "its own release (default label: fingerprint-precision)")] = None,
    s3_endpoint_url: EndpointOpt = None,
    name: Annotated[str | None, typer.Option(help="model label in storage (default: registry or folder name)")] = None,
    timings: Annotated[bool, typer.Option("--timings", help="print where the time went")] = False,
    replace: Annotated[bool, typer.Option(
        "--replace", help="let a probe file replace a stored probe set of the same name")] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="also print Prefect's per-task log lines (always kept in the run logs) and the traceback "
                          "of an unexpected failure")] = False,
) -> None:
    """Embed probe sets with a model, store raw vectors and norms, and run the analyses."""
    from pydantic import ValidationError

    from pipeline.settings import load_settings

    try:
        settings = load_settings(root=root, dask_address=dask_address, n_workers=workers, device=device,
                                 vector_dtype=vector_dtype, s3_endpoint_url=s3_endpoint_url, precision=precision)
    except ValidationError as exc:
        _fail(f"invalid setting: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}")
    if settings.precision != "float32" and not settings.dask_address:  # remote workers check their own device
        from pipeline.embedding.precision import check_requested_precision

        try:
            check_requested_precision(settings.device, settings.precision)
        except (ValueError, RuntimeError) as exc:
            _fail(str(exc))
    from pipeline.names import check_name
    from pipeline.storage.store import StorageError, open_store

    try:  # names become path segments; a bad root fails here, before Prefect, Dask or the model start
        for value, what in ((release, "release label"), (name, "model label")):
            if value is not None:
                check_name(value, what)
        open_store(settings).check_writable()
    except (ValueError, StorageError) as exc:
        _fail(str(exc))
    from pipeline.audit.preflight import check_audit_inputs

    try:  # the model, then every probe set, before Prefect and Dask start: bad input fails in a second
        pre = check_audit_inputs(settings, model, probes, limit, replace, say=_say)
        if release is not None:  # a release holds one precision (the flow checks again)
            from pipeline.embedding.precision import refuse_mixed_release

            label = name or pre.resolved.spec.name
            refuse_mixed_release(open_store(settings).manifests(label, release), label, release, settings.precision)
    except (ValueError, LookupError, RuntimeError, OSError) as exc:
        _fail(str(exc))
    del pre  # its probe sets: the flow loads (and gates) them again; a million items' copy must not wait here
    from flows.boot import start_api, start_local_cluster

    quiet_console(verbose, local_cluster=not settings.dask_address)  # before Prefect and the workers start
    start_api()  # both boot in other processes while the imports below run (seconds each)
    start_local_cluster(settings)
    from flows.audit import run_audit
    from flows.console import failures_once_on_console
    from pipeline.analysis.compare import ReleaseRegression
    from pipeline.progress import RichProgress, use_progress

    failures_once_on_console()  # the error: line below is the one report of a failure

    try:
        with use_progress(RichProgress()):
            summary = run_audit(settings, model, probes, release=release, limit=limit, name=name, replace=replace,
                                timings=timings)
    except ReleaseRegression as exc:
        _print_summary(exc.summary, timings, limit)
        _fail(str(exc), code=3)
    except (ValueError, KeyError, FileNotFoundError, PermissionError, RuntimeError, LookupError) as exc:
        _fail(str(exc))
    _print_summary(summary, timings, limit)


def _print_summary(summary, timings: bool = False, limit: int | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for ps, n in summary.embedded_items.items():
        skipped = summary.skipped_shards.get(ps, 0)
        if n == 0:
            console.print(f"[bold]{ps}[/]: nothing to embed: all {skipped} shards were already committed")
        else:
            reused = summary.reused_shards.get(ps, 0)  # parts an interrupted run wrote, checked and committed
            console.print(f"[bold]{ps}[/]: embedded {n} items ({skipped} shards already committed"
                          + (f"; {reused} written by an interrupted run, checked and reused)" if reused else ")"))
    res = summary.results
    if res is not None and "analysis" in res.columns:  # the other analyses are in the report and `results`
        res = res.filter(res["analysis"] == "norm_vs_property")
    table = Table(title=f"norm_vs_property — {summary.model} @ {summary.release}")
    for col in ("probe_set", "property", "statistic", "value", "n"):
        table.add_column(col, justify="right" if col in ("value", "n") else "left")
    if res is not None and res.height:
        for row in res.iter_rows(named=True):
            value = "—" if row["value"] is None else f"{row['value']:+.4f}"
            table.add_row(row["probe_set"], row["property"], row["statistic"], value, str(row["n"]))
    console.print(table)
    if res is not None and res.height:  # the intervals' method and where it switches (docs/analyses.md)
        from pipeline.analysis.analyses import interval_note

        console.print(interval_note(res), highlight=False, soft_wrap=True)
    from pipeline.cli.claims_view import print_claims

    print_claims(console, summary, limit)
    if summary.alerts is not None and summary.alerts.height:
        for msg in summary.alerts["message"].to_list():
            console.print(f"[bold red]alert[/]: {msg}")
    elif summary.previous_release:
        console.print(f"compared with release {summary.previous_release}: no alert (no tracked statistic moved "
                      "past its threshold beyond its paired 95% interval)")
    if timings:  # start-up phases, then what Prefect recorded: the run's total and each task's runs
        t = Table(title="timings (s)", caption="start-up measured by the CLI; the rest as Prefect recorded the run: "
                  "time running, summed over each task's runs")
        t.add_column("step")
        t.add_column("runs", justify="right")
        t.add_column("seconds", justify="right")
        for k, v in summary.timings.items():
            t.add_row(k, str(v.runs), f"{v.seconds:.2f}")
        console.print(t)
    console.print(f"run {summary.run_id}; fingerprint {summary.fingerprint[:16]}…")
    console.print(f"data: {summary.root}")
    if summary.report:
        console.print(f"report: {summary.report}")
    console.print(f'query it: normaudit sql --root {summary.root} "select * from results"')


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="one read-only SELECT statement")],
    root: RootOpt = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="table, csv, json or parquet")] = OutputFormat.table,
    output: Annotated[Path | None, typer.Option(
        help="write to this file, outside the root (required for parquet)")] = None,
    s3_endpoint_url: EndpointOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a read-only SQL query over the stored tables (DuckDB); it can read nothing outside the root."""
    import duckdb

    from pipeline.settings import load_settings
    from pipeline.storage.catalog import outside_root_error, run_read_only
    from pipeline.storage.store import open_store

    if format is OutputFormat.parquet and output is None:
        _fail("--format parquet writes a binary file: give --output PATH")
    settings = load_settings(root=root, s3_endpoint_url=s3_endpoint_url)
    store = open_store(settings)
    require_store(store, root)  # a mistyped root must not answer 0 rows as if it were an empty store
    if output is not None and store.is_local and output.resolve().is_relative_to(Path(store.base).resolve()):
        # the store is written only through its protocol (parts, manifests); a stray file there is not a table
        _fail(f"refused: --output {output} is inside the storage root {settings.root}; "
              "write the result somewhere outside it", code=2)
    try:
        rel = run_read_only(store, query)
    except PermissionError as exc:
        _fail(str(exc), code=2)
    except (ValueError, duckdb.Error) as exc:
        _fail(f"query failed: {exc}")
    if rel is None:
        return
    try:
        table = printable(rel, format).to_arrow_table()
    except duckdb.PermissionException as exc:  # a read the sandbox refused while the query ran
        _fail(str(outside_root_error(exc, store)), code=2)
    except duckdb.Error as exc:
        _fail(f"query failed: {exc}")
    write_output(table, format, output)


@probes_app.command("build-wordnet")
def build_wordnet(
    wordnet_dir: Annotated[Path, typer.Option(help="WordNet 3.0 database folder")] = Path(
        "/usr/share/wordnet"
    ),
    output: Annotated[Path, typer.Option(help="`wordnet-nouns` Parquet to write")] = Path(
        "pipeline/data/wordnet_nouns.parquet"
    ),
    pairs_output: Annotated[Path, typer.Option(help="`wordnet-pairs` Parquet to write")] = Path(
        "pipeline/data/wordnet_pairs.parquet"
    ),
    verbose: VerboseOpt = False,
) -> None:
    """Build the shipped `wordnet-nouns` and `wordnet-pairs` Parquet files from a WordNet database folder."""
    from pipeline.probes.wordnet import build_wordnet_nouns
    from pipeline.probes.wordnet_pairs import build_wordnet_pairs

    try:
        path = build_wordnet_nouns(wordnet_dir, output)
        pairs = build_wordnet_pairs(wordnet_dir, path, pairs_output)
    except FileNotFoundError as exc:
        _fail(str(exc))
    typer.echo(f"wrote {path} and {pairs}")


@probes_app.command("add")
def probes_add(
    name: Annotated[str, typer.Argument(help="name to store it under (then: audit --probes NAME)")],
    source: Annotated[str, typer.Option(
        "--from", help="file (CSV, TSV, JSONL, Parquet) or BEIR folder; local path or s3://")],
    text: Annotated[str | None, typer.Option("--text", help="column with the text (default: text)")] = None,
    id_col: Annotated[str | None, typer.Option("--id", help="column with the id (default: item_id)")] = None,
    prop: Annotated[list[str] | None, typer.Option(
        "--property", help="COL or NAME=COL, repeatable (default: every other column)")] = None,
    kind: Annotated[str | None, typer.Option(help="item kind: word, sentence, query, doc or pair (default: "
                                             "the kind column, else word when every text is one word, else "
                                             "sentence; the choice is printed)")] = None,
    lang: Annotated[str | None, typer.Option(help="language of every item (words get wordfreq zipf)")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", help="table (default), rating-norms, label-counts or beir")] = None,
    split: Annotated[str | None, typer.Option(help="beir: which qrels/<split>.tsv (default test)")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="replace a stored set of this name")] = False,
    root: RootOpt = None,
    s3_endpoint_url: EndpointOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Validate the user's data and store it as a probe set that `normaudit audit --probes NAME` finds."""
    from pipeline.probes.stored import add_probe_set, summarize
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    settings = load_settings(root=root, s3_endpoint_url=s3_endpoint_url)
    props = None if not prop else dict(p.split("=", 1) if "=" in p else (p, p) for p in prop)
    source_options = settings.model_copy(update={"root": source}).storage_options()
    try:
        ps = add_probe_set(open_store(settings), name, source, fmt, source_options, replace=replace,
                           id_col=id_col, text_col=text, properties=props, kind=kind, lang=lang, split=split)
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        _fail(str(exc))
    from pipeline.audit.preflight import default_tokenizer_warning

    for note in ps.notes:
        _say("note", note)
    if (warning := default_tokenizer_warning(ps)) is not None:
        _say("warning", warning)
    s = summarize(ps, "stored")
    typer.echo(f"stored probe set {name!r}: {s['items']} items ({s['kinds']}); properties: "
               f"{s['properties'] or '-'}; relations: {s['relations'] or '-'}")
    typer.echo(f"audit it: normaudit audit --model MODEL --probes {name} --root {settings.root}")


@probes_app.command("list")
def probes_list(
    root: RootOpt = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="table, csv or json")] = OutputFormat.table,
    s3_endpoint_url: EndpointOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Every probe set (built-in, external, stored under the root) with row counts and properties."""
    import pyarrow as pa

    from pipeline.probes.stored import list_probe_sets
    from pipeline.probes.templates import TEMPLATES
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    if format is OutputFormat.parquet:
        _fail("probes list prints table, csv or json")
    frame = list_probe_sets(open_store(load_settings(root=root, s3_endpoint_url=s3_endpoint_url)))
    write_output(pa.table(frame.to_arrow()), format, None)
    if format is OutputFormat.table:
        typer.echo("templates (word sets): " + ", ".join(f"NAME@{k} = {v!r}" for k, v in TEMPLATES.items()))


def main() -> None:  # pragma: no cover - console entry for `python -m pipeline.cli.main`
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
