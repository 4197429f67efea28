"""The one Great Expectations detail normaudit relies on that GX does not document: where a File
Data Context keeps its validation results.

GX renders Data Docs from a context's validation results store, and documents one way into that
store: running a Checkpoint or Validation Definition on the data. The audit validates each part on
a worker and keeps GX's result as JSON next to the data; when the run's Data Docs are built the
data is no longer at hand, so the results are placed into a fresh File Data Context's store as the
files GX itself writes there (``gx/`` is the folder ``gx.get_context(mode="file", project_root_dir=...)``
creates)::

    <project root>/gx/uncommitted/validations/<suite name, split at dots>/<run name>/<run time>/<batch>.json

That layout is checked against GX 1.24.1, and pyproject.toml pins GX to the range tested with it.
If GX moves it, :func:`check_rendered` raises when a build renders fewer pages than results were
placed (the run's Data Docs are then skipped with a warning), and
``tests/test_validate.py::test_gx_reads_results_placed_by_the_adapter`` fails.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from importlib.metadata import version

VALIDATIONS_DIR = ("gx", "uncommitted", "validations")  # under the project root


class GXLayoutError(RuntimeError):
    """GX did not read the validation results where this adapter placed them (GX changed its layout)."""


def place_validation_result(project_root: str, result: dict, run_name: str, run_time: dt.datetime,
                            batch: str) -> str:
    """Write one validation result (GX's own JSON) where the File Data Context of ``project_root``
    reads its validation results; returns the file's path.

    ``batch`` must be one path segment: the name Data Docs list the result under.
    """
    if not batch or "/" in batch or os.sep in batch:
        raise ValueError(f"batch name {batch!r} must be one non-empty path segment")
    stamp = run_time.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = os.path.join(project_root, *VALIDATIONS_DIR, *result["suite_name"].split("."), run_name, stamp,
                        f"{batch}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, default=str)
    return path


def check_rendered(site_dir: str, placed: int) -> None:
    """Raise :class:`GXLayoutError` unless the site in ``site_dir`` has a page for each placed result."""
    pages = sum(name.endswith(".html") for _, _, names in os.walk(os.path.join(site_dir, "validations"))
                for name in names)
    if pages < placed:
        raise GXLayoutError(
            f"Great Expectations {version('great-expectations')} rendered {pages} validation page(s) for "
            f"{placed} result(s): it no longer reads validation results where pipeline/quality/gx_adapter.py "
            "places them. Install the GX version range pinned in pyproject.toml, or update the adapter."
        )
