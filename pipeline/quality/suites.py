"""Great Expectations suites for every stored table, defined in code and versioned.

Frames are validated at the storage boundary, one part or one table at a time (never a whole
release): ``embeddings`` per staged part, ``token_norms`` before its part is written,
``probe_items``/``probe_properties`` before a probe set is written. GX runs on pandas in an
ephemeral context; values that are not plain columns (vector length, finiteness, unit length
of ``vector / norm``, membership in the shard) are derived here with numpy first, so every
rule is a stock GX expectation that Data Docs can render.

Bump :data:`SUITE_VERSION` whenever an expectation changes: it is part of every suite name
(``embeddings.v1``) and of every stored validation result, so a result says which rules it passed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SUITE_VERSION = 2  # 2: embeddings rows carry text_sha256, which must be the shard's
TABLES = ("probe_items", "probe_properties", "embeddings", "token_norms", "training_trace")
# |‖vector‖ / norm - 1| allowed. float32 vectors reproduce the norm to ~1e-7; float16 rounds each
# component to 11 significant bits (relative error up to 2**-11 ≈ 4.9e-4), so it gets a looser bound.
UNIT_TOLERANCE = {"float32": 1e-4, "float16": 2e-3}
MAX_TEXT_CHARS = 100_000  # a "sane length": longer texts are almost surely a parsing accident
PROPERTY_NAME = r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$"
_FINITE_MAX = float(np.finfo(np.float64).max)  # pandas treats NaN as null; this bound also rejects ±inf
_RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
_ID_COLUMN = {"probe_items": "item_id", "probe_properties": "item_id", "embeddings": "item_id",
              "token_norms": "token_id", "training_trace": "item_id"}
# |change of r^2 - (2 r radial + radial^2 + tangential^2)| allowed, relative to r^2: the trace computes both
# sides in float64 from the same float32 vectors, so anything above rounding means a broken row
TRACE_BALANCE_TOLERANCE = 1e-9


def suite_name(table: str) -> str:
    """The versioned suite name of a table, e.g. ``embeddings.v1``."""
    return f"{table}.v{SUITE_VERSION}"


@dataclass
class Failure:
    """One failed expectation: its type, column, how many rows and a few offending ids."""

    expectation: str
    column: str | None
    count: int | None
    examples: list = field(default_factory=list)
    observed: Any = None
    error: str | None = None

    def describe(self, limit: int = 5) -> str:
        """E.g. ``expect_column_values_to_not_be_null(norm) failed for 3 rows, e.g. ids [...]``."""
        where = f"{self.expectation}({self.column})" if self.column else self.expectation
        if self.error:
            return f"{where} could not run: {self.error}"
        if self.count is None:
            return f"{where}: observed {self.observed!r}"
        shown = self.examples[:limit]
        return f"{where} failed for {self.count} rows, e.g. ids {shown}"


@dataclass
class ValidationReport:
    """The outcome of one suite on one frame, with the full GX result as JSON-ready dict."""

    suite: str
    success: bool
    rows: int
    failures: list[Failure]
    result: dict

    def summary(self, limit: int = 3) -> str:
        """One line naming each failed expectation, its count and a few offending ids."""
        return "; ".join(f.describe() for f in self.failures[:limit]) + (
            f"; and {len(self.failures) - limit} more" if len(self.failures) > limit else "")


class DataValidationError(ValueError):
    """A frame failed its suite; ``report`` holds the GX result, the message says what failed."""

    def __init__(self, message: str, report: ValidationReport):
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------- the suites (data, in code)
def _definitions(gxe) -> dict[str, list]:
    """Every suite's expectations; ``{"$PARAMETER": ...}`` values are bound per frame."""
    p = lambda name: {"$PARAMETER": name}  # noqa: E731 - reads better inline below

    def partition():  # fresh instances: an expectation belongs to one suite
        return [gxe.ExpectColumnValuesToBeInSet(column=c, value_set=p(f"{c}s")) for c in ("model", "release")]

    return {
        "probe_items": [
            gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
            gxe.ExpectColumnValuesToBeUnique(column="item_id"),
            gxe.ExpectColumnValuesToNotBeNull(column="text"),
            gxe.ExpectColumnValuesToMatchRegex(column="text", regex=r"\S"),
            gxe.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, max_value=MAX_TEXT_CHARS),
            gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=p("kinds")),
            gxe.ExpectColumnValuesToBeInSet(column="probe_set", value_set=p("probe_sets")),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
        ],
        "probe_properties": [
            gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
            gxe.ExpectColumnValuesToBeInSet(column="known_item", value_set=[True]),
            gxe.ExpectColumnValuesToNotBeNull(column="property"),
            gxe.ExpectColumnValuesToMatchRegex(column="property", regex=PROPERTY_NAME),
            gxe.ExpectColumnValuesToBeInSet(column="property", value_set=p("properties")),
            gxe.ExpectColumnValuesToNotBeNull(column="value"),
            gxe.ExpectColumnValuesToBeBetween(column="value", min_value=-_FINITE_MAX, max_value=_FINITE_MAX),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["item_id", "property"]),
            gxe.ExpectColumnValuesToBeInSet(column="probe_set", value_set=p("probe_sets")),
        ],
        "embeddings": [
            *partition(),
            gxe.ExpectColumnValuesToBeInSet(column="probe_set", value_set=p("probe_sets")),
            gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
            gxe.ExpectColumnValuesToBeUnique(column="item_id"),
            gxe.ExpectColumnValuesToBeInSet(column="in_shard", value_set=[True]),
            gxe.ExpectColumnValuesToNotBeNull(column="text_sha256"),
            gxe.ExpectColumnValuesToMatchRegex(column="text_sha256", regex=r"^[0-9a-f]{64}$"),
            gxe.ExpectColumnValuesToBeInSet(column="text_is_shards", value_set=[True]),
            gxe.ExpectTableRowCountToEqual(value=p("rows")),
            gxe.ExpectColumnValuesToNotBeNull(column="norm"),
            gxe.ExpectColumnValuesToBeBetween(column="norm", min_value=0, strict_min=True,
                                              max_value=_FINITE_MAX),
            gxe.ExpectColumnUniqueValueCountToBeBetween(column="norm", min_value=p("min_distinct_norms")),
            gxe.ExpectColumnValuesToBeBetween(column="vector_length", min_value=p("dim"), max_value=p("dim")),
            gxe.ExpectColumnValuesToBeInSet(column="vector_finite", value_set=[True]),
            gxe.ExpectColumnValuesToBeBetween(column="unit_length", min_value=p("unit_min"),
                                              max_value=p("unit_max")),
            gxe.ExpectColumnValuesToNotBeNull(column="n_tokens"),
            gxe.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1),
            gxe.ExpectColumnValuesToNotBeNull(column="truncated"),
        ],
        "token_norms": [
            *partition(),
            gxe.ExpectColumnValuesToNotBeNull(column="token_id"),
            gxe.ExpectColumnValuesToBeUnique(column="token_id"),
            gxe.ExpectColumnValuesToBeBetween(column="token_id", min_value=0),
            gxe.ExpectColumnValuesToNotBeNull(column="token"),
            gxe.ExpectColumnValuesToNotBeNull(column="norm"),
            # >= 0, not > 0: some models keep an all-zero padding row
            gxe.ExpectColumnValuesToBeBetween(column="norm", min_value=0, max_value=_FINITE_MAX),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
        ],
        "training_trace": [
            gxe.ExpectColumnValuesToBeInSet(column="run", value_set=p("runs")),
            gxe.ExpectColumnValuesToNotBeNull(column="item_id"),
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["step", "item_id"]),
            gxe.ExpectColumnValuesToBeBetween(column="step", min_value=0),
            gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=p("kinds")),
            gxe.ExpectColumnValuesToBeBetween(column="norm", min_value=0, strict_min=True, max_value=_FINITE_MAX),
            gxe.ExpectColumnValuesToBeBetween(column="radial", min_value=-_FINITE_MAX, max_value=_FINITE_MAX),
            gxe.ExpectColumnValuesToBeBetween(column="tangential", min_value=0, max_value=_FINITE_MAX),
            gxe.ExpectColumnValuesToBeBetween(column="lr", min_value=0, max_value=_FINITE_MAX),
            gxe.ExpectColumnValuesToBeBetween(column="steps_since", min_value=0),
            gxe.ExpectColumnValuesToBeInSet(column="adds_up", value_set=[True]),
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
        ],
    }


GX_LOCK = threading.RLock()  # GX contexts are not thread-safe, and two flows may share a process


def add_suites(context) -> dict:
    """Add every table's suite to the GX ``context`` (``context.suites.add``); returns them by table."""
    import great_expectations as gx  # lazy: GX takes seconds to import, and only validating needs it
    import great_expectations.expectations as gxe

    suites = {}
    for table, expectations in _definitions(gxe).items():
        suite = gx.ExpectationSuite(name=suite_name(table), meta={"suite_version": SUITE_VERSION})
        for e in expectations:
            suite.add_expectation(e)
        suites[table] = context.suites.add(suite)
    return suites


def _new_context():
    """An in-memory GX context holding every suite; returns (context, batch definitions, suites)."""
    import great_expectations as gx  # lazy: see add_suites
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(),
            # progress bars would interleave with the audit's own progress on stderr
            progress_bars=ProgressBarsConfig(globally=False),
        ),
    )
    source = context.data_sources.add_pandas("normaudit")
    batches = {}
    for table in TABLES:
        asset = source.add_dataframe_asset(table)
        batches[table] = asset.add_batch_definition_whole_dataframe(f"{table}-frame")
    return context, batches, add_suites(context)


class _GX:
    """The process's GX context, suites and batch definitions (GX costs seconds to import: once)."""

    _instance: _GX | None = None

    def __init__(self):
        self.context, self.batches, self.suites = _new_context()

    @classmethod
    def get(cls) -> _GX:
        with GX_LOCK:
            if cls._instance is None:
                cls._instance = _GX()
            return cls._instance


def warm_gates() -> None:
    """Import GX and build the suites now (seconds), e.g. while the Prefect API boots."""
    _GX.get()


def run_suite(table: str, frame, params: dict, meta: dict | None = None) -> ValidationReport:
    """Validate a pandas frame against ``table``'s suite with its ``$PARAMETER`` values bound."""
    g = _GX.get()
    id_col = _ID_COLUMN[table]
    fmt = dict(_RESULT_FORMAT)
    if id_col in frame.columns:  # name offending rows by their id, not their position
        fmt["unexpected_index_column_names"] = [id_col]
    with GX_LOCK:
        batch = g.batches[table].get_batch(batch_parameters={"dataframe": frame})
        result = batch.validate(g.suites[table], result_format=fmt, expectation_parameters=params)
    out = result.to_json_dict()
    out["meta"] = {**out.get("meta", {}), "normaudit": {"table": table, "suite_version": SUITE_VERSION,
                                                         **(meta or {})}}
    failures = [_failure(r, id_col) for r in out["results"] if not r["success"]]
    return ValidationReport(suite_name(table), bool(out["success"]), len(frame), failures, out)


def _failure(r: dict, id_col: str) -> Failure:
    cfg, res = r["expectation_config"], r.get("result") or {}
    column = cfg["kwargs"].get("column") or ",".join(cfg["kwargs"].get("column_list", [])) or None
    exc = r.get("exception_info") or {}
    if exc.get("raised_exception"):
        return Failure(cfg["type"], column, None, error=str(exc.get("exception_message")))
    if "unexpected_count" in res:
        ids = [row.get(id_col) for row in res.get("partial_unexpected_index_list") or []]
        ids = ids if any(i is not None for i in ids) else res.get("partial_unexpected_list", [])
        return Failure(cfg["type"], column, int(res["unexpected_count"]), list(ids))
    return Failure(cfg["type"], column, None, observed=res.get("observed_value"))


# ---------------------------------------------------------------- frames at the storage boundary
def embeddings_frame(table: pa.Table, expected_ids: list[str], expected_text_sha256: list[str] | None = None):
    """The columns the ``embeddings`` suite checks, with vector rules derived per row (float64).

    ``text_is_shards``: the row's ``text_sha256`` is the one planned for its item (``expected_text_sha256``,
    aligned with ``expected_ids``); without a plan, that it is present.
    """
    import pandas as pd  # lazy: seconds to import (measured 4.5 s on a busy 2-core machine); GX needs it anyway

    n = table.num_rows
    vec = table["vector"].combine_chunks()
    if isinstance(vec, pa.ChunkedArray):  # an empty table has no chunks to combine
        vec = pa.array([], type=vec.type)
    lengths = pc.fill_null(pc.list_value_length(vec), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    norms = table["norm"].to_numpy(zero_copy_only=False).astype(np.float64)
    present, l2 = _vector_rows(vec, lengths, n)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        unit = l2 / norms
    # membership and planned hashes by Arrow lookups, not a Python dict and set of the shard's ids beside new str
    # objects for every row's id and hash: a worker gates one part after another, and what it allocates stays
    ids, hashes = _strings(table, "item_id", n), _strings(table, "text_sha256", n)
    shard_ids = pa.array(expected_ids, pa.string())
    where = pc.index_in(ids, value_set=shard_ids)  # null: not one of the shard's ids
    planned = None if expected_text_sha256 is None else pa.array(expected_text_sha256, pa.string())
    text_ok = hashes.is_valid() if planned is None else pc.fill_null(pc.equal(hashes, pc.take(planned, where)), False)
    return pd.DataFrame({
        "model": table["model"].to_pandas(), "release": table["release"].to_pandas(),
        "probe_set": table["probe_set"].to_pandas(),
        # the rows are the shard's, in its order (every part the audit writes): its own str objects serve
        "item_id": expected_ids if ids.equals(shard_ids) else table["item_id"].to_pandas(),
        "text_sha256": (expected_text_sha256 if planned is not None and hashes.equals(planned)
                        else table["text_sha256"].to_pandas() if "text_sha256" in table.column_names else [None] * n),
        "text_is_shards": np.asarray(text_ok), "norm": norms,
        # int64: GX compares int32 (and any dtype but Python's int and float) one row at a time in Python
        "n_tokens": pc.cast(table["n_tokens"], pa.int64()).to_pandas(), "truncated": table["truncated"].to_pandas(),
        "vector_length": lengths, "vector_finite": present,
        # rows with non-finite components are already named by vector_finite; keep them out of this rule
        "unit_length": np.where(present, unit, 1.0), "in_shard": np.asarray(where.is_valid()),
    })


def _strings(table: pa.Table, name: str, n: int) -> pa.Array:
    """A column as one string array to look up; nulls where the table has no such column (parts written before
    it) or holds no strings there (such values match no shard id or hash, so their rows fail)."""
    if name not in table.column_names:
        return pa.nulls(n, pa.string())
    col = table[name]
    arr = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
    arr = arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return arr.cast(pa.string())
    return pa.nulls(n, pa.string())


def _vector_rows(vec: pa.Array, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether the vector is present with finite components only, and its L2 length.

    Vectors of one length (every part the audit writes) are read as one ``[n, dim]`` matrix: a
    million-item audit validates 400 million components, and the per-component float64 copy and
    ``bincount`` of the general path cost more than the part's commit. The length is summed in float64.
    """
    valid = np.asarray(vec.is_valid())
    if n and valid.all() and (lengths == lengths[0]).all() and lengths[0] > 0:
        dim = int(lengths[0])
        values = pc.list_flatten(vec).to_numpy(zero_copy_only=False).reshape(n, dim)
        finite = np.isfinite(values).all(axis=1)
        if not finite.all():  # such rows fail vector_finite; their length is not looked at
            values = np.where(np.isfinite(values), values, 0)
        with np.errstate(over="ignore", invalid="ignore"):
            l2 = np.sqrt(np.einsum("ij,ij->i", values, values, dtype=np.float64))
        return finite, l2
    values = pc.list_flatten(vec).to_numpy(zero_copy_only=False).astype(np.float64)
    rows = pc.list_parent_indices(vec).to_numpy(zero_copy_only=False)
    bad = np.bincount(rows, weights=~np.isfinite(values), minlength=n) > 0
    with np.errstate(over="ignore", invalid="ignore"):
        squares = np.nan_to_num(values, nan=0, posinf=0, neginf=0) ** 2
        l2 = np.sqrt(np.bincount(rows, weights=squares, minlength=n))
    return valid & ~bad, l2


def validate_embeddings(table: pa.Table, expected_ids: list[str], dim: int, vector_dtype: str,
                        model: str, release: str, probe_set: str,
                        meta: dict | None = None, expected_text_sha256: list[str] | None = None) -> ValidationReport:
    """Run the ``embeddings`` suite on one part: the shard's ids once each, each with the shard's
    ``text_sha256`` (``expected_text_sha256``, aligned with ``expected_ids``; the audit always gives it),
    finite positive norms, ``dim``-long finite vectors whose ``vector / norm`` has unit length,
    ``n_tokens >= 1``."""
    tol = UNIT_TOLERANCE.get(vector_dtype, UNIT_TOLERANCE["float16"])
    params = {"models": [model], "releases": [release], "probe_sets": [probe_set], "dim": dim,
              "rows": len(expected_ids), "unit_min": 1 - tol, "unit_max": 1 + tol,
              # one item cannot vary; two or more identical norms mean a constant (broken) output
              "min_distinct_norms": 2 if len(expected_ids) > 1 else 1}
    report = run_suite("embeddings", embeddings_frame(table, expected_ids, expected_text_sha256), params, meta)
    shard_ids = pa.array(expected_ids, pa.string())
    present = pc.is_in(shard_ids, value_set=_strings(table, "item_id", table.num_rows))
    missing = sorted(shard_ids.filter(pc.invert(present)).to_pylist())
    if missing:
        report.failures.append(Failure("shard item ids present", "item_id", len(missing), missing))
        report.success = False
    return report


def validate_token_norms(table: pa.Table, model: str, release: str,
                         meta: dict | None = None) -> ValidationReport:
    """Run the ``token_norms`` suite: unique non-negative token ids, finite norms >= 0."""
    return run_suite("token_norms", table.to_pandas(), {"models": [model], "releases": [release]}, meta)


def validate_probe_tables(probe_set: str, items, properties, kinds, known_properties=None,
                          meta: dict | None = None) -> list[ValidationReport]:
    """Run the ``probe_items`` and ``probe_properties`` suites on a probe set's polars frames.

    ``known_properties`` restricts property names (default: any well-formed name).
    """
    items_pd = items.to_pandas().assign(probe_set=probe_set)
    # by polars: Python loops over pandas' Arrow-backed strings took ~0.1 s each per 131,072-row block
    known = properties["item_id"].is_in(items["item_id"].implode()).fill_null(False).to_numpy()
    props_pd = properties.to_pandas().assign(probe_set=probe_set, known_item=known)
    present = properties["property"].drop_nulls().unique().to_list()
    names = sorted(known_properties) if known_properties is not None else sorted(present)
    return [
        run_suite("probe_items", items_pd, {"kinds": sorted(kinds), "probe_sets": [probe_set]}, meta),
        run_suite("probe_properties", props_pd, {"properties": names, "probe_sets": [probe_set]}, meta),
    ]


def validate_training_trace(table: pa.Table, runs: list[str], kinds: tuple[str, ...],
                            meta: dict | None = None) -> ValidationReport:
    """Run the ``training_trace`` suite: one row per (step, item), finite positive norms, and a displacement
    whose parts add back up to the row's change of r^2 (``adds_up``, derived here)."""
    frame = table.to_pandas()
    norm, change, radial, tan = (frame[c].to_numpy(np.float64) for c in ("norm", "r2_change", "radial", "tangential"))
    with np.errstate(invalid="ignore"):
        before = np.sqrt(np.maximum(norm**2 - change, 0.0))
        gap = np.abs(change - (2 * before * radial + radial**2 + tan**2))
        frame["adds_up"] = gap <= TRACE_BALANCE_TOLERANCE * np.maximum(np.maximum(norm**2, before**2), 1e-30)
    return run_suite("training_trace", frame, {"runs": runs, "kinds": list(kinds)}, meta)
