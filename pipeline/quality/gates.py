"""Quality gates at the storage boundary: nothing reaches a view without passing its GX suite.

* :func:`gate_part`: an embeddings part, on the worker that embedded it, before it is written. On failure
  the part and its GX result go to ``quarantine/<run_id>/<probe_set>/`` and :class:`PartValidationError` names
  the expectation, the count and a few item ids.
* :func:`gate_token_norms`: the token-norm table, before it is written (quarantined likewise).
* :func:`gate_probe_set`: a probe set's items and properties, before they are written.
* :func:`gate_trace_part`: a part of a fine-tune's ``training_trace``, before it is written (quarantined).

Every result, passed or failed, is kept under ``reports/validation/<run_id>/`` for the run's
Data Docs (:mod:`pipeline.quality.datadocs`).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa

from pipeline.quality.datadocs import build_data_docs, data_docs_path, save_validation, validation_key
from pipeline.quality.suites import (
    DataValidationError,
    ValidationReport,
    validate_embeddings,
    validate_probe_tables,
    validate_token_norms,
    validate_training_trace,
)
from pipeline.storage import lease
from pipeline.storage.parts import PartValidationError, quarantine_table
from pipeline.storage.shards import Shard
from pipeline.storage.store import Manifest, Store, sha256_bytes

_log = logging.getLogger(__name__)


def gate_part(store: Store, table: pa.Table, data: bytes, shard: Shard, template: Manifest,
              run_id: str) -> ValidationReport:
    """Validate one shard's part (``table``, encoded as ``data``) with the ``embeddings`` suite, where it was
    embedded (a worker); quarantine it and raise if it fails.

    The rows must be exactly the shard's items, each with the text hash the shard was planned with.
    """
    sha = sha256_bytes(data)
    meta = {"run_id": run_id, "shard_id": shard.shard_id, "model": template.model, "release": template.release,
            "probe_set": shard.probe_set, "sha256": sha}
    report = validate_embeddings(table, shard.item_ids, template.dim, template.vector_dtype, template.model,
                                 template.release, shard.probe_set, meta, shard.text_sha256)
    save_validation(store, run_id, validation_key("embeddings", shard.probe_set, f"part-{shard.shard_id}"), report)
    if not report.success:
        folder = quarantine_table(store, run_id, shard.probe_set, shard.shard_id, data, _quarantine_record(report))
        raise PartValidationError(
            f"shard {shard.shard_id} of probe set {shard.probe_set!r} ({template.model} @ {template.release}) failed "
            f"{report.suite} and was quarantined in {store.url(folder)}: {report.summary()}. Nothing of it is "
            f"visible. The GX result is next to the part and in {data_docs_path(store, run_id)}."
        )
    return report


def gate_token_norms(store: Store, table: pa.Table, model: str, release: str, run_id: str | None) -> None:
    """Validate the token-norm table before it is written; quarantine it and raise if it fails."""
    meta = {"run_id": run_id, "model": model, "release": release}
    report = validate_token_norms(table, model, release, meta)
    if run_id:
        save_validation(store, run_id, validation_key("token_norms", f"{model}__{release}"), report)
    if report.success:
        return
    folder = _quarantine_table(store, f"quarantine/{run_id or 'no-run'}/token_norms/{model}/{release}",
                               "part-0.parquet", table, report)
    raise DataValidationError(
        f"token norms of {model} @ {release} failed {report.suite} and were quarantined in "
        f"{store.url(folder)}: {report.summary()}. The model's input embedding table has non-finite or "
        "duplicate rows; check the weights.", report)


def _quarantine_table(store: Store, folder: str, name: str, table: pa.Table, report: ValidationReport) -> str:
    """Write a table that failed its suite, and the readable report beside it, under ``folder``."""
    store.write_table(f"{folder}/{name}", table)
    store.write_bytes_atomic(f"{folder}/{name.removesuffix('.parquet')}.report.json",
                             json.dumps(_quarantine_record(report)).encode())
    return folder


def trace_dir(run: str) -> str:
    """Folder of a fine-tune run's ``training_trace`` parts, relative to the root."""
    return f"training_trace/{run}"


def gate_trace_part(store: Store, table: pa.Table, run: str, kinds: tuple[str, ...], run_id: str) -> str:
    """Validate trace rows and write them as one part named by their first step; returns its path.

    A part that fails is quarantined under ``quarantine/<run_id>/training_trace/`` and raises
    :class:`DataValidationError`; nothing of it reaches the ``training_trace`` view.
    """
    first = int(table["step"][0].as_py())
    name = f"part-{first:06d}.parquet"
    report = validate_training_trace(table, [run], kinds, {"run_id": run_id, "run": run, "part": name})
    save_validation(store, run_id, validation_key("training_trace", run, name.removesuffix(".parquet")), report)
    if not report.success:
        folder = _quarantine_table(store, f"quarantine/{run_id}/training_trace/{run}", name, table, report)
        raise DataValidationError(
            f"trace rows of run {run!r} from step {first} failed {report.suite} and were quarantined in "
            f"{store.url(folder)}: {report.summary()}. The training diverged or the trace is broken; "
            "lower the learning rate or rerun.", report)
    rel = f"{trace_dir(run)}/{name}"
    store.write_table(rel, table)
    return rel


def gate_probe_set(store: Store, ps, kinds, run_id: str | None = None) -> None:
    """Validate a probe set's items and properties before they are written; raise naming what failed."""
    reports = validate_probe_tables(ps.name, ps.items, ps.properties, kinds, meta={"run_id": run_id})
    for report in reports:
        table = report.suite.split(".")[0]
        if run_id:
            save_validation(store, run_id, validation_key(table, ps.name), report)
        if not report.success:
            raise DataValidationError(
                f"probe set {ps.name!r} ({ps.origin or 'built-in'}) failed {report.suite}: {report.summary()}. "
                "Nothing was written; fix those rows of the probe set and rerun.", report)


def _quarantine_record(report: ValidationReport) -> dict:
    """What goes next to a quarantined file: a readable summary, then the full GX result."""
    return {
        "suite": report.suite, "success": report.success, "rows": report.rows,
        "failures": [f.describe(limit=20) for f in report.failures],
        "validation_result": report.result,
    }


def open_release(store: Store, model: str, release: str, run_id: str, ttl_s: float = lease.DEFAULT_TTL_S
                 ) -> lease.Lease:
    """Take the release's lease before any embedding (raises LeaseHeldError if another run has it)."""
    return lease.acquire(store, model, release, run_id, ttl_s)


def close_release(store: Store, model: str, release: str, run_id: str, held: lease.Lease | None,
                  data_docs: bool = True) -> str | None:
    """Release the run's lease and build its Data Docs; returns the docs URL (None if nothing validated).

    Runs in the flow's ``finally``: it must never hide the run's own error, so a docs failure is
    logged, not raised. An interrupted run skips the docs (``data_docs=False``): the user asked it
    to stop, and the validation results stay under ``reports/validation/<run_id>/``.
    """
    try:
        return build_data_docs(store, run_id) if data_docs else None
    except Exception as exc:  # noqa: BLE001 - see docstring
        _log.warning("Data Docs for run %s were not built: %s: %s", run_id, type(exc).__name__, exc)
        return None
    finally:
        if held is None:  # an interrupt between taking the lease and keeping it: the run's own, by its id
            cur = lease.current_lease(store, model, release)
            held = cur if cur is not None and cur.run_id == run_id else None
        if held is not None:  # only the run's own generation: one taken over is another run's now
            lease.release(store, model, release, held)
