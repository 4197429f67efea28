"""Validation results on storage and the GX Data Docs site built from them, next to the data.

Every validated frame leaves its GX result at ``reports/validation/<run_id>/<key>.json``
(passed or failed). At the end of a run those results are rendered by GX's own site builder
into ``reports/data_docs/<run_id>/index.html``; :func:`data_docs_path` is what a report links to.
The site is built in a local temporary folder and copied through the store, so an ``s3://``
root gets the same files as a local one.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid

from pipeline.quality.suites import _GX, ValidationReport
from pipeline.storage.store import Store

VALIDATION_DIR = "reports/validation"
DOCS_DIR = "reports/data_docs"
# GX ships two multi-megabyte walkthrough animations the generated pages never reference
_SKIP_SUFFIXES = (".gif",)


def validation_key(table: str, *parts: str) -> str:
    """Where a result sits inside its run's folder, e.g. ``embeddings/mini/part-<shard>``."""
    return "/".join([table, *parts])


def save_validation(store: Store, run_id: str, key: str, report: ValidationReport) -> str:
    """Store one GX validation result as JSON; returns its path relative to the root."""
    rel = f"{VALIDATION_DIR}/{run_id}/{key}.json"
    store.write_bytes_atomic(rel, json.dumps(report.result, indent=1, default=str).encode())
    return rel


def data_docs_path(store: Store, run_id: str) -> str:
    """URL of the run's Data Docs index page (exists once :func:`build_data_docs` ran)."""
    return store.url(DOCS_DIR, run_id, "index.html")


def build_data_docs(store: Store, run_id: str) -> str | None:
    """Render every stored validation result of ``run_id`` as a GX Data Docs site under the root.

    Returns the URL of its ``index.html``, or ``None`` when the run validated nothing.
    """
    files = store.glob(f"{VALIDATION_DIR}/{run_id}/**/*.json")
    if not files:
        return None
    g = _GX.get()
    from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResultSchema
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    schema = ExpectationSuiteValidationResultSchema()
    run = RunIdentifier(run_name=run_id)
    prefix = f"{VALIDATION_DIR}/{run_id}/"
    with g.lock, tempfile.TemporaryDirectory(prefix="normaudit-docs-") as tmp:
        context = g.fresh_context()
        site = f"run-{uuid.uuid4().hex[:8]}"
        context.add_data_docs_site(site, {
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": tmp},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        })
        for rel in files:
            result = schema.load(json.loads(store.read_bytes(rel)))
            # GX keys are path segments: a nested key becomes one segment
            batch = rel[len(prefix):-len(".json")].replace("/", "__")
            key = ValidationResultIdentifier(ExpectationSuiteIdentifier(name=result.suite_name), run, batch)
            context.validation_results_store.set(key, result)
        context.build_data_docs(site_names=[site])
        for folder, _, names in os.walk(tmp):
            for name in names:
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                local = os.path.join(folder, name)
                rel = os.path.relpath(local, tmp).replace(os.sep, "/")
                with open(local, "rb") as fh:
                    store.write_bytes_atomic(f"{DOCS_DIR}/{run_id}/{rel}", fh.read())
    return data_docs_path(store, run_id)
