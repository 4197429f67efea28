"""Run records (``runs``) and analysis outputs (``results``) on storage."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field

import polars as pl

from pipeline import __version__
from pipeline.catalog import SCHEMAS
from pipeline.store import Store


def new_run_id() -> str:
    """Sortable, unique run id: UTC timestamp plus a random suffix."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


@dataclass
class RunRecord:
    """One audit run, as stored in the ``runs`` table (no credentials: params are non-secret settings)."""

    run_id: str
    model: str
    release: str
    fingerprint: str
    probe_set: str
    params: dict
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    finished_at: dt.datetime | None = None
    timings: dict = field(default_factory=dict)
    status: str = "running"
    message: str = ""
    code_version: str = __version__

    def frame(self) -> pl.DataFrame:
        row = {
            "run_id": self.run_id, "model": self.model, "release": self.release, "fingerprint": self.fingerprint,
            "probe_set": self.probe_set, "params": json.dumps(self.params, sort_keys=True),
            "code_version": self.code_version,
            "started_at": self.started_at.replace(tzinfo=None),
            "finished_at": self.finished_at.replace(tzinfo=None) if self.finished_at else None,
            "timings": json.dumps({k: round(v, 3) for k, v in self.timings.items()}),
            "status": self.status, "message": self.message,
        }
        return pl.DataFrame([row], schema={
            **{c: pl.String for c in SCHEMAS["runs"]},
            "started_at": pl.Datetime("us"), "finished_at": pl.Datetime("us"),
        })


def write_run(store: Store, run: RunRecord) -> None:
    """Write (or overwrite) the run's record."""
    store.write_table(f"runs/{run.run_id}.parquet", run.frame().to_arrow())


def write_results(store: Store, run_id: str, analysis: str, results: pl.DataFrame) -> str:
    """Write one analysis's ``results`` rows for a run; returns the path relative to the root."""
    rel = f"results/{run_id}/{analysis}.parquet"
    store.write_table(rel, results.to_arrow())
    return rel
