"""Run records (``runs``) and analysis outputs (``results``) on storage.

A run in status ``running`` also has a marker ``runs/running/<run_id>.json`` naming its process
(host, pid, start time), written before its record and removed after its final record. A run
whose process is gone, or (seen from another host) whose lease expired, is *abandoned*: a
SIGKILL or a power cut ended it before it could record an end. :func:`find_abandoned` lists
them; :func:`sweep_abandoned` records them as ``abandoned`` and removes their markers (the parts such a
run wrote but never committed are orphans: the next audit reuses them). Every audit sweeps at its start;
``normaudit verify`` reports them and ``verify --repair`` sweeps.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

import polars as pl

from pipeline import __version__
from pipeline.storage.catalog import SCHEMAS
from pipeline.storage.lease import DEFAULT_TTL_S, current_lease, holder_alive, process_started
from pipeline.storage.store import Store


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


RUNNING_DIR = "runs/running"
FINAL_STATUSES = ("completed", "alerted", "failed", "interrupted", "abandoned")


def _marker(run_id: str) -> str:
    return f"{RUNNING_DIR}/{run_id}.json"


def write_run(store: Store, run: RunRecord) -> None:
    """Write (or overwrite) the run's record; keep its liveness marker while it is ``running``."""
    if run.status == "running":  # the marker first: a record that says running always has one
        pid = os.getpid()
        store.write_bytes_atomic(_marker(run.run_id), json.dumps({
            "run_id": run.run_id, "model": run.model, "release": run.release, "host": socket.gethostname(),
            "pid": pid, "pid_started": process_started(pid), "started_at": run.started_at.timestamp(),
        }).encode())
    store.write_table(f"runs/{run.run_id}.parquet", run.frame().to_arrow())
    if run.status != "running":
        store.rm(_marker(run.run_id))


def run_status(store: Store, run_id: str) -> str | None:
    """The recorded status of a run, None if it has no record."""
    try:
        return pl.read_parquet(io.BytesIO(store.read_bytes(f"runs/{run_id}.parquet")))["status"].item()
    except FileNotFoundError:
        return None


@dataclass
class AbandonedRun:
    """A run that ended without recording it."""

    run_id: str
    reason: str
    model: str | None = None
    release: str | None = None

    def describe(self) -> str:
        what = f"run {self.run_id} ({self.model} @ {self.release})" if self.model else f"run {self.run_id}"
        return f"{what}: {self.reason}"


def _why_abandoned(store: Store, holder: dict, now: float) -> str | None:
    """Why the run behind a liveness marker is dead, or None while it may be alive."""

    if holder["host"] == socket.gethostname():
        if holder_alive(holder["host"], holder["pid"], holder["pid_started"]):
            return None  # alive on this host: it may still be working, whatever its lease says
        return f"its process (pid {holder['pid']} on {holder['host']}) is gone"
    lease = current_lease(store, holder["model"], holder["release"])
    if lease is not None and lease.run_id == holder["run_id"] and not lease.released:
        if now <= lease.renewed_at + lease.ttl_s:
            return None
        return "its lease expired at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lease.renewed_at +
                                                                                         lease.ttl_s))
    if now > holder["started_at"] + DEFAULT_TTL_S:
        return (f"it holds no lease of {holder['model']} @ {holder['release']} and started over "
                f"{DEFAULT_TTL_S / 60:.0f} minutes ago")
    return None  # another host's run that may be about to take its lease


def find_abandoned(store: Store) -> list[AbandonedRun]:
    """Runs recorded as running whose process is gone (or, on another host, whose lease expired)."""
    now = time.time()
    found: dict[str, AbandonedRun] = {}
    for rel in store.glob(f"{RUNNING_DIR}/*.json"):
        try:
            holder = json.loads(store.read_bytes(rel))
        except FileNotFoundError:  # its run ended between the listing and the read
            continue
        reason = _why_abandoned(store, holder, now)
        if reason is not None:
            found[holder["run_id"]] = AbandonedRun(holder["run_id"], reason, holder["model"], holder["release"])
    return sorted(found.values(), key=lambda r: r.run_id)


def sweep_abandoned(store: Store, runs: list[AbandonedRun]) -> None:
    """Record each abandoned run as ``abandoned`` (if it still says running) and remove its marker."""
    for run in runs:
        rel = f"runs/{run.run_id}.parquet"
        if run.model is not None and run_status(store, run.run_id) == "running":
            record = pl.read_parquet(io.BytesIO(store.read_bytes(rel)))
            ended = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            record = record.with_columns(
                status=pl.lit("abandoned"), message=pl.lit(f"abandoned: {run.reason}"[:2000]),
                finished_at=pl.lit(ended).cast(record.schema["finished_at"]))
            store.write_table(rel, record.to_arrow())
        store.rm(_marker(run.run_id))


def write_claims(store: Store, run_id: str, claims: pl.DataFrame) -> str:
    """Write a run's claims table (``pipeline.analysis.claims``); returns the path relative to the root."""
    rel = f"claims/{run_id}.parquet"
    store.write_table(rel, claims.to_arrow())
    return rel


def write_results(store: Store, run_id: str, analysis: str, results: pl.DataFrame) -> str:
    """Write one analysis's ``results`` rows for a run; returns the path relative to the root."""
    rel = f"results/{run_id}/{analysis}.parquet"
    store.write_table(rel, results.to_arrow())
    return rel
