"""Object storage: fsspec paths, atomic Parquet/JSON writes, manifests (docs/design.md "Storage protocol").

Every path is relative to one root URL (a local folder or ``s3://bucket/prefix``).
A part becomes visible only when a manifest written after it lists it; a manifest
is replaced in one atomic step (rename on a local disk, a single PUT on S3).
On a remote root every operation is retried by :mod:`pipeline.storage.retry`, the one retry owner.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.names import check_name
from pipeline.storage import retry as retries
from pipeline.storage.retry import DEFAULT_POLICY, PREFLIGHT_POLICY, RetryPolicy

T = TypeVar("T")
MANIFEST = "_manifest.json"
# botocore makes one attempt per request and s3fs one try per call: the store's retry is the only one,
# so an outage costs a known number of requests (pipeline.storage.retry). botocore's "standard" mode is
# named so that AWS_RETRY_MODE / AWS_MAX_ATTEMPTS in the environment cannot add attempts below it.
SINGLE_ATTEMPT = {"mode": "standard", "total_max_attempts": 1}
# DuckDB reads parts through its own filesystem calls, which the store cannot wrap: that filesystem keeps
# botocore's standard retries (up to 5 attempts per request, its own jittered back-off capped at 20 s).
QUERY_ATTEMPTS = {"mode": "standard", "total_max_attempts": 5}


class StorageError(RuntimeError):
    """The storage root cannot be used; the message says which root and what to do."""


class StorageUnavailableError(StorageError):
    """A storage operation still failed with transient errors when its retries ran out (an outage)."""


class CorruptPartError(StorageError):
    """A committed file's bytes differ from the sha256 (or size) its manifest recorded."""


@dataclass
class PartInfo:
    """One committed (or staged) Parquet part of an embeddings partition."""

    shard_id: str
    file: str  # file name inside the partition folder
    rows: int
    sha256: str
    start: int = 0  # offset of the shard's first item in the probe set's stable order
    size: int | None = None  # bytes; None in manifests written before sizes were recorded


@dataclass
class Manifest:
    """The list of committed parts of one (model, release, probe_set) partition, written last."""

    model: str
    release: str
    probe_set: str
    fingerprint: str
    params: dict[str, Any]
    dim: int
    vector_dtype: str
    parts: list[PartInfo] = field(default_factory=list)
    precision: str = "float32"  # dtype of the forward pass (manifests written before it was recorded: float32)
    updated_at: float = 0.0
    format: int = 1

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        raw = json.loads(data)
        raw["parts"] = [PartInfo(**p) for p in raw.get("parts", [])]
        return cls(**raw)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# The top-level folders normaudit writes: a root holding none of them holds no normaudit store.
STORE_FOLDERS = ("probes", "embeddings", "token_norms", "runs", "results", "alerts", "comparisons", "leases",
                 "quarantine", "reports", "training_trace", "theory")


class Store:
    """Paths and atomic reads/writes under one storage root.

    ``retry`` is the policy of every operation on a remote root (:mod:`pipeline.storage.retry`);
    ``fs`` makes a single attempt per request, so call it through :meth:`retry`.
    """

    def __init__(self, root: str, storage_options: dict | None = None, retry: RetryPolicy = DEFAULT_POLICY):
        self.root_url = root
        self.storage_options = dict(storage_options or {})
        self.retry_policy = retry
        self.fs, base = _open_fs(root, self.storage_options, SINGLE_ATTEMPT)
        self.base = base.rstrip("/")
        self.is_local = "file" in _protocols(self.fs)
        self._query_fs = None

    def __reduce__(self):
        # rebuilt from its arguments where it lands (a Dask worker): the filesystem's single-attempt
        # setting is an attribute fsspec's own pickling would not carry
        return (Store, (self.root_url, self.storage_options, self.retry_policy))

    @property
    def query_fs(self):
        """The filesystem DuckDB reads through: the store's own on a local root, else one with botocore retries.

        DuckDB makes its range requests itself, out of reach of :meth:`retry`; see ``QUERY_ATTEMPTS``.
        """
        if self.is_local:
            return self.fs
        if self._query_fs is None:
            self._query_fs = _open_fs(self.root_url, self.storage_options, QUERY_ATTEMPTS)[0]
        return self._query_fs

    # ---------- paths ----------
    def url(self, *parts: str) -> str:
        """Full URL of a path under the root, as DuckDB and other readers need it."""
        path = self.path(*parts)
        return path if self.is_local else f"{_protocols(self.fs)[0]}://{path}"

    def path(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts) if parts else self.base

    def embeddings_dir(self, model: str, release: str, probe_set: str) -> str:
        check_name(model, "model name")
        check_name(release, "release label")
        check_name(probe_set, "probe set name")
        return f"embeddings/model={model}/release={release}/probe_set={probe_set}"

    def token_norms_dir(self, model: str, release: str) -> str:
        check_name(model, "model name")
        check_name(release, "release label")
        return f"token_norms/model={model}/release={release}"

    def probes_dir(self, probe_set: str) -> str:
        return f"probes/probe_set={check_name(probe_set, 'probe set name')}"

    # ---------- checks ----------
    def check_writable(self) -> None:
        """Fail fast, before any embedding work, when the root cannot be written."""
        probe = self.path(f".write-check-{uuid.uuid4().hex}")
        try:
            self.retry(lambda: self.fs.makedirs(self.base, exist_ok=True), "create the root", PREFLIGHT_POLICY)
            self.retry(lambda: self.fs.pipe_file(probe, b"ok"), "write a test file", PREFLIGHT_POLICY)
            self.retry(lambda: self.fs.rm_file(probe), "remove the test file", PREFLIGHT_POLICY)
        except Exception as exc:  # noqa: BLE001 - any backend error means the same thing to the user
            raise StorageError(
                f"cannot write to storage root {self.root_url!r}: {type(exc).__name__}: {exc}. "
                "Check the path exists and is writable (or the bucket, endpoint and credentials for s3://), "
                "or pass another --root."
            ) from exc

    def why_no_store(self) -> str | None:
        """Why the root holds no normaudit store (it is missing, a file, or holds none of :data:`STORE_FOLDERS`),
        or None when it holds one. Reads only: a mistyped root must not look like an empty store, nor be created.
        """
        if not self.retry(lambda: self.fs.exists(self.base), "look at the root"):
            return "it does not exist"
        if self.retry(lambda: self.fs.isfile(self.base), "look at the root"):
            return "it is a file"
        names = {p.rstrip("/").rsplit("/", 1)[-1]
                 for p in self.retry(lambda: self.fs.ls(self.base, detail=False), "list the root")}
        if not names & set(STORE_FOLDERS):
            return "it holds none of normaudit's folders (probes/, embeddings/, runs/, ...)"
        return None

    # ---------- retries ----------
    def retry(self, fn: Callable[[], T], what: str, policy: RetryPolicy | None = None) -> T:
        """Return ``fn()``; on a remote root, retry its transient errors (:func:`pipeline.storage.retry.call`).

        A local root calls ``fn`` once: a local disk has no transient errors worth waiting for.
        Errors that are not transient (a missing file, a refused permission) are raised unchanged;
        when the retries run out, :class:`StorageUnavailableError` names the operation and what to do.
        """
        if self.is_local:
            return fn()
        try:
            return retries.call(fn, what, policy or self.retry_policy)
        except retries.GaveUp as gave_up:
            raise StorageUnavailableError(
                f"storage {self.root_url!r} did not answer: {what} failed {gave_up.attempts} times in "
                f"{gave_up.elapsed_s:.0f} s (last error: {retries.describe(gave_up.last)}). The endpoint is down, "
                "throttling or unreachable: check it (and --s3-endpoint-url / AWS_ENDPOINT_URL), then run the "
                "same command again (an audit keeps what it committed and redoes only the rest)."
            ) from gave_up.last

    # ---------- bytes ----------
    def exists(self, rel: str) -> bool:
        return self.retry(lambda: self.fs.exists(self.path(rel)), f"exists {rel}")

    def read_bytes(self, rel: str) -> bytes:
        return self.retry(lambda: self.fs.cat_file(self.path(rel)), f"read {rel}")

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` with ``data`` only if it does not exist; True if this call created it.

        Local roots use ``link(2)`` of a complete temporary file (atomic, fails if the name exists);
        S3 uses a conditional PUT (``If-None-Match: *``).
        """
        dest = self.path(rel)
        if self.is_local:
            parent = posixpath.dirname(dest)
            os.makedirs(parent, exist_ok=True)
            tmp = posixpath.join(parent, f".tmp-{uuid.uuid4().hex}")
            with open(tmp, "wb") as fh:
                fh.write(data)
            try:
                os.link(tmp, dest)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        attempts = 0

        def put() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                self.fs.pipe_file(dest, data, mode="create")
                return True
            except FileExistsError:
                # an earlier attempt may have landed with its response lost: then the object is ours
                return attempts > 1 and self.fs.cat_file(dest) == data

        return self.retry(put, f"create {rel}")

    def write_bytes_atomic(self, rel: str, data: bytes) -> None:
        """Write so that readers see the old content or the new one, never a torn file."""
        dest = self.path(rel)
        parent = posixpath.dirname(dest)
        if self.is_local:
            self.fs.makedirs(parent, exist_ok=True)
            tmp = posixpath.join(parent, f".tmp-{uuid.uuid4().hex}")
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, dest)  # rename(2): atomic on one filesystem
        else:
            self.retry(lambda: self.fs.pipe_file(dest, data), f"write {rel}")  # one PUT: atomic on S3

    def put_file(self, local: str, rel: str) -> None:
        """Upload the local file ``local`` to ``rel`` so that readers see the old content or the new one: a rename
        on a local root, one (multipart) upload on S3, which the object only appears at the end of."""
        dest = self.path(rel)
        if self.is_local:
            self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            tmp = posixpath.join(posixpath.dirname(dest), f".tmp-{uuid.uuid4().hex}")
            self.fs.put_file(local, tmp)
            self.fs.mv(tmp, dest)
        else:
            self.retry(lambda: self.fs.put_file(local, dest), f"write {rel}")

    def move(self, src_rel: str, dest_rel: str) -> None:
        src, dest = self.path(src_rel), self.path(dest_rel)
        if self.is_local:
            self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            self.fs.mv(src, dest)
            return

        def copy_then_delete() -> None:
            try:
                self.fs.copy(src, dest)
            except FileNotFoundError:
                # a previous attempt copied and deleted, and only its response was lost;
                # callers that need the content check its sha256 (see parts.commit_part)
                if self.fs.exists(dest):
                    return
                raise
            self.fs.rm_file(src)

        self.retry(copy_then_delete, f"move {src_rel}")

    def rm(self, rel: str, recursive: bool = False) -> None:
        if self.exists(rel):
            self.retry(lambda: self.fs.rm(self.path(rel), recursive=recursive), f"remove {rel}")

    def glob(self, pattern: str) -> list[str]:
        """Relative paths under the root matching ``pattern``, sorted."""
        hits = self.retry(lambda: self.fs.glob(self.path(pattern)), f"list {pattern}")
        prefix = self.base + "/"
        return sorted(h[len(prefix):] if h.startswith(prefix) else h for h in hits)

    # ---------- parquet ----------
    def write_table(self, rel: str, table: pa.Table, row_group_size: int | None = None) -> tuple[int, str]:
        """Atomically write a Parquet file; returns (rows, sha256 of the file bytes).

        ``row_group_size`` (rows): smaller groups let a reader of a slice decode only the rows near it.
        """
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd", row_group_size=row_group_size)
        data = buf.getvalue()
        self.write_bytes_atomic(rel, data)
        return table.num_rows, sha256_bytes(data)

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        def read() -> pa.Table:
            with self.fs.open(self.path(rel), "rb") as fh:
                return pq.read_table(fh, columns=columns)

        return self.retry(read, f"read {rel}")

    # ---------- manifests ----------
    def read_manifest(self, model: str, release: str, probe_set: str) -> Manifest | None:
        rel = f"{self.embeddings_dir(model, release, probe_set)}/{MANIFEST}"
        if not self.exists(rel):
            return None
        return Manifest.from_json(self.read_bytes(rel))

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.updated_at = time.time()
        rel = f"{self.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)}/{MANIFEST}"
        self.write_bytes_atomic(rel, manifest.to_json())

    def manifests(self, model: str = "*", release: str = "*") -> list[Manifest]:
        """Every committed embeddings manifest under the root (of one model and release where given)."""
        paths = self.glob(f"embeddings/model={model}/release={release}/*/{MANIFEST}")
        return [Manifest.from_json(self.read_bytes(p)) for p in paths]

    def committed_part_urls(self) -> list[str]:
        """URLs of the parts listed in committed manifests: the only parts readers may see."""
        urls = []
        for m in self.manifests():
            d = self.embeddings_dir(m.model, m.release, m.probe_set)
            urls.extend(self.url(d, p.file) for p in m.parts)
        return urls


def _open_fs(root: str, options: dict, botocore_retries: dict):
    """The filesystem of ``root``; on S3 with ``botocore_retries`` below and one try per s3fs call."""
    if not root.startswith(("s3://", "s3a://")):
        return fsspec.core.url_to_fs(root, **options)
    config = {**options.get("config_kwargs", {}), "retries": botocore_retries}
    fs, base = fsspec.core.url_to_fs(root, **{**options, "config_kwargs": config})
    # s3fs's own loop (5 tries of some errors, nested twice on reads) is a class attribute its maintainers
    # document as the knob; set on this instance only (fsspec caches it per distinct options: ours alone)
    fs.retries = 1
    return fs, base


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def open_store(settings) -> Store:
    """The :class:`Store` for ``settings.root`` with its S3 options."""
    return Store(settings.root, settings.storage_options())
