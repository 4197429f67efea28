"""Validation results on storage and the GX Data Docs site built from them, next to the data.

Every validated frame leaves its GX result at ``reports/validation/<run_id>/<key>.json``
(passed or failed). At the end of a run those results are rendered by GX's own site builder
into ``reports/data_docs/<run_id>/index.html``; :func:`data_docs_path` is what a report links to.
The site is built in a File Data Context in a local temporary folder and copied through the
store, so an ``s3://`` root gets the same files as a local one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from urllib.parse import urlparse
from urllib.request import url2pathname

from pipeline.quality.gx_adapter import check_rendered, place_validation_result
from pipeline.quality.suites import GX_LOCK, ValidationReport, add_suites
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

    Raises:
        pipeline.quality.gx_adapter.GXLayoutError: the installed GX did not render the results.
    """
    files = store.glob(f"{VALIDATION_DIR}/{run_id}/**/*.json")
    if not files:
        return None
    import great_expectations as gx  # lazy: GX takes seconds to import, and only runs that validated get here

    prefix = f"{VALIDATION_DIR}/{run_id}/"
    run_time = dt.datetime.now(dt.UTC)
    with GX_LOCK, tempfile.TemporaryDirectory(prefix="normaudit-docs-") as tmp:
        context = gx.get_context(mode="file", project_root_dir=tmp)
        add_suites(context)  # the site lists the suites the results were validated against
        for rel in files:
            # Data Docs name a result by one path segment: a nested key becomes one segment
            batch = rel[len(prefix):-len(".json")].replace("/", "__")
            place_validation_result(tmp, json.loads(store.read_bytes(rel)), run_id, run_time, batch)
        (index_url,) = context.build_data_docs().values()  # a new File Data Context has one site
        site = os.path.dirname(url2pathname(urlparse(index_url).path))
        check_rendered(site, len(files))
        for folder, _, names in os.walk(site):
            for name in names:
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                local = os.path.join(folder, name)
                rel = os.path.relpath(local, site).replace(os.sep, "/")
                with open(local, "rb") as fh:
                    store.write_bytes_atomic(f"{DOCS_DIR}/{run_id}/{rel}", fh.read())
    return data_docs_path(store, run_id)
