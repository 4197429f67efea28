"""An audit's analyses end to end: every analysis of the release, its ``results`` rows and the claims they decide."""

from __future__ import annotations

import polars as pl

from pipeline.analysis.analyses import AUDIT_ANALYSES, RESULT_COLUMNS, run_analysis
from pipeline.analysis.claims import claims_table, store_claims
from pipeline.storage.catalog import open_catalog
from pipeline.storage.runs import write_results
from pipeline.storage.store import Store


def analyse_and_store(store: Store, model: str, release: str, run_id: str,
                      memory_limit: str | None = None) -> pl.DataFrame:
    """Run :data:`AUDIT_ANALYSES` over the committed data of ``model`` at ``release``, store each analysis's
    ``results`` rows (an analysis whose inputs the probe sets lack has no rows, and no file) and then the
    claims table they decide (``claims``); returns the results rows. ``memory_limit``: DuckDB's (default: its
    own, 80% of the machine's memory)."""
    con = open_catalog(store, memory_limit=memory_limit)
    frames = []
    try:
        for name in AUDIT_ANALYSES:
            res = run_analysis(con, name, model, release, run_id)
            if res.height:
                write_results(store, run_id, name, res)
                frames.append(res)
        results = pl.concat(frames) if frames else pl.DataFrame(schema=dict.fromkeys(RESULT_COLUMNS, pl.String))
        store_claims(store, claims_table(con, results, model, release, run_id))
    finally:
        con.close()  # the catalog keeps the memory it freed until it closes (pipeline.storage.catalog.connect)
    return results
