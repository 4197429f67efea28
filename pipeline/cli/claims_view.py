"""The claims table as the audit's summary prints it: each claim's verdict, then one line per test."""

from __future__ import annotations

import polars as pl

from pipeline.analysis.claims import limit_note, p_text, read_claims, test_text
from pipeline.settings import load_settings
from pipeline.storage.store import open_store

RULE = "rule and populations: docs/analyses.md, 'The claims table'"


def claims_lines(claims: pl.DataFrame, title: str) -> list[str]:
    """The lines to print for ``claims`` (:data:`pipeline.analysis.claims.CLAIM_COLUMNS`)."""
    lines = [f"{title} ({RULE})"]
    for (claim,), part in claims.group_by(["claim"], maintain_order=True):
        lines.append(f"{claim.replace('_', ' ')}: {part['verdict'][0]}")
        for row in part.iter_rows(named=True):
            ci = "" if row["ci_low"] is None else f" [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
            p = p_text(row["p_holm"], row["n_resamples"])
            lines.append(f"  {test_text(row)} = {row['value']:+.3f}{ci}, Holm p {p}, {row['evidence']} "
                         f"(claimed {row['direction']}); {row['population']}")
    return lines


def print_claims(console, summary, limit: int | None = None) -> None:
    """After an audit: the line saying what a ``--limit`` sample is, then the run's claims table if any."""
    if note := limit_note(limit):
        console.print(note, highlight=False, soft_wrap=True)
    claims = read_claims(open_store(load_settings(root=summary.root)), summary.run_id)
    if claims.height:
        for line in claims_lines(claims, f"claims — {summary.model} @ {summary.release}"):
            console.print(line, highlight=False, soft_wrap=True)
