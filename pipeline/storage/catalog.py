"""DuckDB catalog: views over committed data only, and a read-only query gate.

Views are rebuilt from storage each time a catalog is opened: ``embeddings``
lists exactly the parts named in committed manifests, so a staged,
quarantined or half-written part can never be read, and only the rows whose
(probe_set, item_id, text_sha256) is a current probe item's, so a vector of a
text that has since changed is never joined to the new text.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import uuid
from collections.abc import Iterator

import duckdb

from pipeline.settings import MEMORY_SIZE
from pipeline.storage.store import Store
from pipeline.storage.verify import raise_if_corrupt, verify_root

# Column types of each view, used for an empty view when nothing is stored yet.
SCHEMAS: dict[str, dict[str, str]] = {
    "probe_items": {
        "probe_set": "VARCHAR", "item_id": "VARCHAR", "text": "VARCHAR",
        "kind": "VARCHAR", "lang": "VARCHAR", "source": "VARCHAR", "text_sha256": "VARCHAR",
    },
    "probe_properties": {"probe_set": "VARCHAR", "item_id": "VARCHAR", "property": "VARCHAR", "value": "DOUBLE"},
    "probe_relations": {
        "probe_set": "VARCHAR", "left_id": "VARCHAR", "right_id": "VARCHAR", "relation": "VARCHAR", "value": "DOUBLE",
    },
    "embeddings": {
        "model": "VARCHAR", "release": "VARCHAR", "probe_set": "VARCHAR", "item_id": "VARCHAR",
        "text_sha256": "VARCHAR", "norm": "DOUBLE", "vector": "FLOAT[]", "n_tokens": "INTEGER", "truncated": "BOOLEAN",
    },
    "token_norms": {
        "model": "VARCHAR", "release": "VARCHAR", "token_id": "BIGINT", "token": "VARCHAR", "norm": "DOUBLE",
    },
    "token_properties": {
        "model": "VARCHAR", "release": "VARCHAR", "token_id": "BIGINT", "property": "VARCHAR", "value": "DOUBLE",
    },
    "runs": {
        "run_id": "VARCHAR", "model": "VARCHAR", "release": "VARCHAR", "fingerprint": "VARCHAR",
        "probe_set": "VARCHAR", "params": "VARCHAR", "code_version": "VARCHAR", "started_at": "TIMESTAMP",
        "finished_at": "TIMESTAMP", "timings": "VARCHAR", "status": "VARCHAR", "message": "VARCHAR",
    },
    "results": {
        "run_id": "VARCHAR", "analysis": "VARCHAR", "model": "VARCHAR", "release": "VARCHAR",
        "probe_set": "VARCHAR", "property": "VARCHAR", "statistic": "VARCHAR", "value": "DOUBLE",
        "ci_low": "DOUBLE", "ci_high": "DOUBLE", "n": "BIGINT", "n_resamples": "BIGINT", "ci_method": "VARCHAR",
    },
    "alerts": {
        "run_id": "VARCHAR", "analysis": "VARCHAR", "model": "VARCHAR", "release": "VARCHAR",
        "previous_release": "VARCHAR", "probe_set": "VARCHAR", "property": "VARCHAR", "statistic": "VARCHAR",
        "previous_value": "DOUBLE", "value": "DOUBLE", "change": "DOUBLE", "ci_low": "DOUBLE", "ci_high": "DOUBLE",
        "threshold": "DOUBLE", "message": "VARCHAR",
    },
    # pipeline/analysis/claims.py: CLAIM_COLUMNS, one file per audit
    "claims": {
        "run_id": "VARCHAR", "model": "VARCHAR", "release": "VARCHAR", "claim": "VARCHAR", "verdict": "VARCHAR",
        "probe_set": "VARCHAR", "population": "VARCHAR", "analysis": "VARCHAR", "property": "VARCHAR",
        "statistic": "VARCHAR", "controls": "VARCHAR", "direction": "VARCHAR", "null_value": "DOUBLE",
        "value": "DOUBLE", "ci_low": "DOUBLE", "ci_high": "DOUBLE", "n": "BIGINT", "n_resamples": "BIGINT",
        "ci_method": "VARCHAR", "p_value": "DOUBLE", "p_holm": "DOUBLE", "evidence": "VARCHAR",
    },
    # pipeline/theory/trace.py: TRACE_SCHEMA, one folder of parts per fine-tune run
    "training_trace": {
        "run": "VARCHAR", "step": "BIGINT", "item_id": "VARCHAR", "kind": "VARCHAR", "norm": "DOUBLE",
        "r2_change": "DOUBLE", "radial": "DOUBLE", "tangential": "DOUBLE", "lr": "DOUBLE", "steps_since": "BIGINT",
    },
    # pipeline/analysis/paired.py: PAIRED_COLUMNS under the run that compared
    "comparisons": {
        "run_id": "VARCHAR", "analysis": "VARCHAR", "probe_set": "VARCHAR", "property": "VARCHAR",
        "statistic": "VARCHAR", "base_model": "VARCHAR", "base_release": "VARCHAR", "model": "VARCHAR",
        "release": "VARCHAR", "base_value": "DOUBLE", "value": "DOUBLE", "difference": "DOUBLE",
        "ci_low": "DOUBLE", "ci_high": "DOUBLE", "n_shared": "BIGINT", "n_only_base": "BIGINT",
        "n_only_other": "BIGINT", "n_resamples": "BIGINT", "verdict": "VARCHAR",
    },
}

# Where each view's files live (glob relative to the root); embeddings come from manifests instead.
GLOBS = {
    "probe_items": "probes/*/items.parquet",
    "probe_properties": "probes/*/properties.parquet",
    "probe_relations": "probes/*/relations.parquet",
    "token_norms": "token_norms/*/*/part-*.parquet",
    "token_properties": "token_norms/*/*/properties.parquet",
    "runs": "runs/*.parquet",
    "results": "results/*/*.parquet",
    "alerts": "alerts/*.parquet",
    "comparisons": "comparisons/*.parquet",
    "claims": "claims/*.parquet",
    "training_trace": "training_trace/*/part-*.parquet",
}

ALLOWED_STATEMENTS = {"SELECT", "EXPLAIN"}
_EXPLAIN_PREFIX = re.compile(r"^\s*explain\s+(analy[sz]e\s+|\([^)]*\)\s*)?", re.IGNORECASE)


class ReadOnlyError(PermissionError):
    """A statement that would write, change the schema or reach outside the catalog."""


def _empty_view(name: str) -> str:
    cols = ", ".join(f"null::{t} as {c}" for c, t in SCHEMAS[name].items())
    return f"create or replace view {name} as select {cols} where false"


# Columns that files written by older versions lack: what the view shows instead.
# A probe item's text hash is the sha256 of its text's UTF-8 bytes, which DuckDB computes the same way.
_ABSENT = {("probe_items", "text_sha256"): "sha256(text)"}
_FILLED = {("probe_items", "text_sha256"): "coalesce(text_sha256::VARCHAR, sha256(text))"}


def _file_view(con: duckdb.DuckDBPyConnection, name: str, urls: list[str], wrap=None) -> None:
    """View ``name`` over ``urls`` with its :data:`SCHEMAS` columns (absent ones null); ``wrap`` turns
    that SELECT into the view's query (e.g. a filter), when given."""
    if not urls:
        con.execute(_empty_view(name))
        return
    files = "[" + ", ".join("'" + u.replace("'", "''") + "'" for u in urls) + "]"
    source = f"read_parquet({files}, union_by_name = true)"

    def create(present) -> None:
        cols = ", ".join(
            f"{_FILLED.get((name, c), f'{c}::{t}')} as {c}" if present is None or c in present
            else f"{_ABSENT.get((name, c), f'null::{t}')} as {c}"
            for c, t in SCHEMAS[name].items())
        # view DDL cannot take bound parameters; the paths come from our own listing, quoted above
        select = f"select {cols} from {source}"
        con.execute(f"create or replace view {name} as {wrap(select) if wrap else select}")

    try:
        create(None)
    except duckdb.BinderException:  # files written before a column existed (e.g. text_sha256): read it as absent
        create({d[0] for d in con.execute(f"select * from {source} limit 0").description})


def _embeddings_view(con: duckdb.DuckDBPyConnection, urls: list[str]) -> None:
    """``embeddings``: the committed rows whose text hash is their probe item's current one (a semi-join).

    A row embedded from a text that has since changed under the same item id, or from a part written
    before rows carried ``text_sha256``, is not shown: ``normaudit verify`` names such parts and the
    next audit of their release re-embeds them.
    """
    _file_view(con, "embeddings", urls, wrap=lambda rows: (
        f"select e.* from ({rows}) e semi join probe_items p on e.probe_set = p.probe_set "
        "and e.item_id = p.item_id and e.text_sha256 = p.text_sha256"))


def connect(sandbox: Store | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection, set up as the catalog's (and the analysis benchmark's) are.

    Buffer memory DuckDB frees is kept by its block allocator, up to the memory limit, until the connection
    closes, instead of going back to the operating system between operators: the analyses free and reallocate
    gigabytes per query at millions of items, and faulting those pages in again from the kernel took about a
    tenth of the analysis suite's time (benchmarks/analysis_suite.py). Close the connection to give it back.

    With ``sandbox`` (a store), the connection can read files under that store's root and nothing else:
    DuckDB's external access is off with the root as its only allowed directory (DuckDB resolves ``..``
    and symbolic links before comparing), extensions are never installed or loaded automatically (a URL
    it cannot read fails instead of downloading one), and Python variables are not scanned as tables.
    :func:`open_catalog` registers an ``s3://`` root's s3fs with it, so DuckDB reads that root (and only it,
    whatever else the credentials reach) through the store's own filesystem.

    With ``memory_limit`` (DuckDB's form: ``"512MB"``, ``"2GiB"``), DuckDB holds at most that much and spills the
    rest of a large join, sort or window to a new folder under the system's temp folder (removed on close).
    """
    limit = _checked_memory_limit(memory_limit)
    # DuckDB allows reading its spill directory too; its default, ./.tmp, may hold anything of the user's (and
    # a spill there lands wherever the process runs). A new name under the system's temp folder, created only if
    # DuckDB spills and removed on close.
    spill = {"temp_directory": os.path.join(tempfile.gettempdir(), f"normaudit-sql-{uuid.uuid4().hex}")}
    sandboxed = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                 "python_enable_replacements": False}
    con = duckdb.connect(":memory:", config={**sandboxed, **spill} if sandbox else spill if limit else {})
    if limit:
        con.execute(f"set memory_limit = '{limit}'")  # checked: digits and a unit
    # the setting can be raised but never lowered on a live database: set once, here, to the memory limit
    limit = con.execute("select current_setting('memory_limit')").fetchone()[0]
    con.execute(f"set block_allocator_memory = '{limit}'")  # a setting takes a literal, not a parameter
    if sandbox:
        # DuckDB refuses allowed_directories in the connect config (the database is not started yet)
        # and once external access is off: set it first, then close access
        dirs = ", ".join("'" + d.replace("'", "''") + "'" for d in sandbox_directories(sandbox))
        con.execute(f"set allowed_directories = [{dirs}]")
        con.execute("set enable_external_access = false")
    return con


_MEMORY_LIMIT = re.compile(MEMORY_SIZE, re.IGNORECASE)


def _checked_memory_limit(memory_limit: str | None) -> str | None:
    if memory_limit is None or _MEMORY_LIMIT.fullmatch(memory_limit.strip()):
        return memory_limit and memory_limit.strip()
    raise ValueError(f"memory limit {memory_limit!r}: give a size such as 512MB or 2GiB")


class MemoryBudgetError(MemoryError):
    """DuckDB needed more memory than a step's budget allows, even spilling to disk: the message names the setting
    that sets the budget and what to do."""


@contextlib.contextmanager
def within_memory(limit: str | None, what: str, setting: str = "NORMAUDIT_ANALYSIS_MEMORY") -> Iterator[None]:
    """Run ``what``'s DuckDB work on connections of memory limit ``limit`` (from ``setting``): DuckDB's
    out-of-memory error (a sort or window it cannot spill far enough) becomes a :class:`MemoryBudgetError` that
    says which setting to raise, instead of DuckDB's advice to change its own settings, which the user cannot
    reach."""
    try:
        yield
    except duckdb.OutOfMemoryException as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MemoryBudgetError(
            f"{what} needed more than {setting}={limit} of DuckDB memory, even spilling to disk ({said}): set "
            f"{setting} higher (e.g. 1GB; 256MB is enough for the analyses of 10 M items) and run it again"
        ) from exc


def sandbox_directories(store: Store) -> list[str]:
    """The directories a sandboxed connection may read: the store's root, under each name of its protocol."""
    if store.is_local:
        return [store.base.rstrip("/") + "/"]
    protocols = (store.fs.protocol,) if isinstance(store.fs.protocol, str) else tuple(store.fs.protocol)
    return [f"{p}://{store.base.rstrip('/')}/" for p in protocols]


def open_catalog(store: Store, con: duckdb.DuckDBPyConnection | None = None,
                 verify: str | None = "size", memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection (:func:`connect`) with one view per table of docs/design.md.

    ``verify`` checks committed parts against their manifests first and raises
    :class:`~pipeline.storage.store.CorruptPartError` naming the file: ``"size"`` (default; one listing),
    ``"sha256"`` (reads every byte) or ``None`` (skip). See :mod:`pipeline.storage.verify`.
    """
    con = con or connect(memory_limit=memory_limit)
    if not store.is_local:
        con.register_filesystem(store.query_fs)  # DuckDB reads out of reach of Store.retry: see query_fs
    for name, pattern in GLOBS.items():
        _file_view(con, name, [store.url(p) for p in store.glob(pattern)])
    if verify:
        raise_if_corrupt(store, verify_root(store, verify).problems)
    _embeddings_view(con, store.committed_part_urls())
    return con


def check_read_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse anything but SELECT/EXPLAIN: no writes, DDL, COPY, ATTACH, SET or PRAGMA."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise ValueError(f"cannot parse the query: {exc}") from exc
    if not statements:
        raise ValueError("the query is empty; give one SELECT statement")
    for st in statements:
        kind = st.type.name
        if kind not in ALLOWED_STATEMENTS:
            raise ReadOnlyError(
                f"refused: `normaudit sql` is read-only and this is a {kind} statement "
                f"({str(st.query).strip()[:60]!r}). Only SELECT (and EXPLAIN) run here; "
                "to change stored data, run an audit."
            )
        if kind == "EXPLAIN":
            # EXPLAIN ANALYZE executes its statement (EXPLAIN ANALYZE COPY ... TO writes the file): check it too
            inner = _EXPLAIN_PREFIX.sub("", str(st.query), count=1)
            try:
                if inner == str(st.query):
                    raise ValueError("no statement after EXPLAIN")
                check_read_only(con, inner)
            except ValueError as exc:
                raise ReadOnlyError(
                    f"refused: cannot tell what this EXPLAIN would run ({exc}); write it as "
                    "EXPLAIN [ANALYZE] SELECT ..."
                ) from exc


def run_read_only(store: Store, query: str):
    """Open a sandboxed catalog (:func:`connect`), check ``query`` is read-only, run it; returns a DuckDB relation.

    Raises :class:`ReadOnlyError` for a statement that is not a SELECT/EXPLAIN, and for one that reads
    anything outside the store's root (another path, URL or bucket): see :func:`outside_root_error`.
    """
    con = open_catalog(store, connect(sandbox=store))
    check_read_only(con, query)
    # Once the views exist nothing else needs configuring: lock it so SET cannot reopen access.
    con.execute("set lock_configuration = true")
    try:
        return con.sql(query)
    except duckdb.PermissionException as exc:
        raise outside_root_error(exc, store) from exc


def outside_root_error(exc: duckdb.PermissionException, store: Store) -> ReadOnlyError:
    """The refusal to show for DuckDB's "Cannot access file" in a sandboxed catalog: what, and what is allowed."""
    match = re.search(r'Cannot access file "([^"]*)"', str(exc))
    what = f"the query reads {match.group(1)!r}, outside" if match else "the query reaches outside"
    return ReadOnlyError(
        f"refused: {what} the storage root. `normaudit sql` may only read the stored tables under "
        f"{store.root_url} (the views embeddings, probe_items, results, runs, ... or files under that root); "
        "no other file, URL, bucket or extension is reachable from it."
    )
