"""``normaudit verify``: check committed parts against their manifests and their rows against the probe
items' texts, optionally quarantine the bad ones.

Imports stay inside the command, as in :mod:`pipeline.cli.main`: loading the CLI stays cheap for every command.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline.cli.errors import VerboseOpt
from pipeline.cli.roots import require_store


def verify(
    root: Annotated[str | None, typer.Option("--root", help="storage root URL (default $NORMAUDIT_ROOT)")] = None,
    repair: Annotated[bool, typer.Option(
        "--repair", help="move corrupt or stale parts to quarantine/ and drop them from their manifest "
        "(the next audit re-embeds them)")] = False,
    quick: Annotated[bool, typer.Option(
        "--quick", help="compare sizes (one listing) instead of reading every byte; the text hashes are "
        "still checked (two columns of each part)")] = False,
    s3_endpoint_url: Annotated[str | None, typer.Option(
        "--s3-endpoint-url", help="S3-compatible endpoint (default $AWS_ENDPOINT_URL)")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Check every committed part's sha256 against its manifest, and that every row's text_sha256 is its
    probe item's current text hash; exit 1 if any differs (unless repaired)."""
    from pipeline.settings import load_settings
    from pipeline.storage.lease import LeaseHeldError
    from pipeline.storage.store import open_store
    from pipeline.storage.verify import TEXT_KINDS, verify_root
    from pipeline.storage.verify import repair as repair_parts

    settings = load_settings(root=root, s3_endpoint_url=s3_endpoint_url)
    store = open_store(settings)
    require_store(store, root)  # a mistyped root is not "ok" for 0 parts
    report = verify_root(store, "size" if quick else "sha256", texts=True, leftovers=True)
    typer.echo(f"checked {report.parts} parts in {report.partitions} partitions of {store.root_url} "
               f"({report.depth})")
    _check_abandoned(store, repair)  # reported, never an exit 1: committed data does not depend on them
    # reported, never an exit 1 (no reader ever sees them); a repair a live run's lease refuses is one
    refused = _check_orphans(store, report.orphans, repair, settings.lease_ttl_s)
    refused += _check_leftovers(store, report.leftovers, repair, settings.lease_ttl_s)
    for p in report.problems:
        label = "stale" if p.kind in TEXT_KINDS else "corrupt"
        typer.secho(f"{label}: {store.url(p.file)}: {p.kind}: {p.detail}", fg=typer.colors.RED, err=True)
    if report.ok and not refused:
        typer.echo("ok: every committed part matches its manifest and every row its probe item's text")
        return
    if report.ok:
        _refuse(refused)
    if not repair:
        typer.secho(f"error: {len(report.problems)} part(s) do not match their manifest or their probe items' "
                    "texts. Rerun with --repair to move them to quarantine and drop them from their manifest; "
                    "the next audit of that release re-embeds them.", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    try:
        folder = repair_parts(store, report.problems, settings.lease_ttl_s)
    except LeaseHeldError as exc:
        _refuse([*refused, str(exc)])
    if refused:
        _refuse(refused)
    typer.echo(f"repaired: {len(report.problems)} part(s) moved to {store.url(folder)} and dropped from their "
               "manifests; rerun the audit of "
               + ", ".join(sorted({f"{p.model}@{p.release}" for p in report.problems})) + " to re-embed them")


def _refuse(refusals: list[str]) -> None:
    """Exit 1 with one error line: a live run holds a release that needed repair (each refusal names it)."""
    said = "; ".join(dict.fromkeys(refusals))
    typer.secho(f"error: --repair refused: {said}", fg=typer.colors.RED, err=True)
    raise typer.Exit(1)


def _check_orphans(store, orphans: list[str], repair: bool, ttl_s: float) -> list[str]:
    """List part files no manifest lists (a run killed between writing and committing them); repair removes them
    under each release's lease. Returns the refusals (a live run holds the release: it may still commit them)."""
    from pipeline.storage.verify import remove_orphans

    for rel in orphans:
        typer.secho(f"orphan: {store.url(rel)}: written by a worker, never committed (invisible)",
                    fg=typer.colors.YELLOW, err=True)
    if orphans and repair:
        removed, refused = remove_orphans(store, orphans, ttl_s)
        typer.echo(f"repaired: {len(removed)} orphan part(s) removed")
        return refused
    if orphans:
        typer.echo("note: the next audit of their release reuses them (when their bytes match their name); "
                   "--repair removes them", err=True)
    return []


def _check_leftovers(store, leftovers: list[str], repair: bool, ttl_s: float) -> list[str]:
    """List ``.tmp-*`` files of writes that never finished; repair removes them (a release's under its lease, the
    others once older than the lease TTL). Returns the refusals."""
    from pipeline.storage.verify import remove_leftovers

    for rel in leftovers:
        typer.secho(f"leftover: {store.url(rel)}: a temporary file of a write that never finished (invisible)",
                    fg=typer.colors.YELLOW, err=True)
    if leftovers and repair:
        removed, refused = remove_leftovers(store, leftovers, ttl_s)
        kept = len(leftovers) - len(removed)
        typer.echo(f"repaired: {len(removed)} leftover file(s) removed"
                   + (f"; {kept} kept (a write may still be using them)" if kept else ""))
        return refused
    if leftovers:
        typer.echo("note: --repair removes them", err=True)
    return []


def _check_abandoned(store, repair: bool) -> None:
    """Report runs that ended unrecorded (a SIGKILL, a power cut); repair records them as abandoned."""
    from pipeline.storage.runs import find_abandoned, sweep_abandoned

    found = find_abandoned(store)
    for run in found:
        typer.secho(f"abandoned: {run.describe()}", fg=typer.colors.YELLOW, err=True)
    if found and repair:
        sweep_abandoned(store, found)
        typer.echo(f"repaired: {len(found)} abandoned run(s) recorded as abandoned")
    elif found:
        typer.echo("note: --repair (or the next audit of any release) records them as abandoned", err=True)
