"""Integrity of committed data: every part a manifest lists must have the bytes it recorded.

Two depths, chosen by cost:

* ``size`` (one recursive listing of ``embeddings/``): catches a missing, truncated or replaced
  file. :func:`pipeline.storage.catalog.open_catalog` runs it every time, so no query reads a part
  that is visibly wrong.
* ``sha256`` (reads every byte): catches any change, including a flipped byte that keeps the
  size. ``normaudit verify`` runs it, and so does an audit's planning for the partition it is
  about to extend, before trusting which shards are done.

``normaudit verify`` also checks every committed row against its probe item (``texts=True``): the
row's ``text_sha256`` must be the item's current one. A part with a row embedded from a text that
has since changed (``stale_text``), or written before rows carried the hash (``no_text_hash``, an
older store), is reported; the ``embeddings`` view already hides those rows, and an audit of the
release re-embeds them by itself. Planning and the catalog do not run this check: a changed text
is work for the next audit, not corruption.

A part file in a partition folder that no manifest lists is an *orphan*: a worker wrote it and its run
was killed before the flow committed it. It is invisible to every reader; ``verify`` lists it (not an
error), the next audit of its release reuses it when its bytes still match the sha256 in its name, and
``verify --repair`` removes it under the release's lease: while a live run holds it (that run may still commit
its parts) the repair of that release is refused, naming the run. ``.tmp-*`` files of a write that was killed
(a local root's atomic writes) are *leftovers*: listed, and removed by ``--repair`` the same way.

A corrupt part is never repaired silently: a storage layer that changes bytes is news for
whoever runs it. ``normaudit verify --repair`` moves such parts to ``quarantine/`` and drops
them from their manifest (under the release's lease); the next audit re-embeds their shards.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pipeline.probes.base import text_sha256
from pipeline.storage import lease
from pipeline.storage.shards import committed_item_ids
from pipeline.storage.store import CorruptPartError, Manifest, Store, sha256_bytes


@dataclass
class Problem:
    """One committed part that is not what its manifest says."""

    model: str
    release: str
    probe_set: str
    shard_id: str
    file: str  # relative to the root
    kind: str  # missing, size, sha256; stale_text, no_text_hash (TEXT_KINDS)
    detail: str


@dataclass
class VerifyReport:
    """What was checked and what was wrong."""

    depth: str
    partitions: int = 0
    parts: int = 0
    problems: list[Problem] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)  # part files no manifest lists, relative to the root
    leftovers: list[str] = field(default_factory=list)  # ``.tmp-*`` files of writes that never finished

    @property
    def ok(self) -> bool:
        """True when no committed part differs from its manifest."""
        return not self.problems


# Problems with what a part's rows say about their texts, not with its bytes.
TEXT_KINDS = ("stale_text", "no_text_hash")


def _partition(store: Store, m: Manifest) -> str:
    return store.embeddings_dir(m.model, m.release, m.probe_set)


def verify_manifest(store: Store, manifest: Manifest, depth: str = "sha256",
                    sizes: dict[str, int] | None = None) -> list[Problem]:
    """Problems of one partition's committed parts (``depth`` ``size`` or ``sha256``).

    ``sizes`` maps relative paths to byte sizes (from one listing; listed here when not given).
    """
    if depth not in ("size", "sha256"):
        raise ValueError(f"depth must be 'size' or 'sha256', not {depth!r}")
    if depth == "size" and sizes is None:
        sizes = _sizes(store)
    d = _partition(store, manifest)
    problems = []
    for p in manifest.parts:
        rel = f"{d}/{p.file}"
        where = (manifest.model, manifest.release, manifest.probe_set, p.shard_id, rel)
        if depth == "sha256":
            try:
                data = store.read_bytes(rel)
            except FileNotFoundError:
                problems.append(Problem(*where, "missing", "listed in the manifest but not on storage"))
                continue
            if p.size is not None and len(data) != p.size:
                problems.append(Problem(*where, "size", f"{len(data)} bytes, manifest says {p.size}"))
            elif sha256_bytes(data) != p.sha256:
                problems.append(Problem(*where, "sha256", f"sha256 is not the manifest's {p.sha256[:12]}…"))
            continue
        size = sizes.get(rel)
        if size is None:
            problems.append(Problem(*where, "missing", "listed in the manifest but not on storage"))
        elif p.size is not None and size != p.size:
            problems.append(Problem(*where, "size", f"{size} bytes, manifest says {p.size}"))
    return problems


def _sizes(store: Store) -> dict[str, int]:
    """Byte size of every file under ``embeddings/``, from one recursive listing."""
    base = store.path("embeddings")
    if not store.exists("embeddings"):
        return {}
    found = store.retry(lambda: store.fs.find(base, detail=True), "list embeddings/")
    prefix = store.base + "/"
    return {k[len(prefix):] if k.startswith(prefix) else k: int(v.get("size") or 0) for k, v in found.items()}


def probe_text_hashes(store: Store, probe_set: str) -> dict[str, str]:
    """``item_id -> text_sha256`` of a stored probe set's items now (hashed from the text if not stored)."""
    rel = f"{store.probes_dir(probe_set)}/items.parquet"
    if not store.exists(rel):
        return {}
    items = store.read_table(rel)
    ids = items["item_id"].to_pylist()
    hashes = (items["text_sha256"].to_pylist() if "text_sha256" in items.column_names
              else text_sha256(items["text"].to_pylist()))
    return dict(zip(ids, hashes, strict=True))


def verify_texts(store: Store, manifest: Manifest, current: dict[str, str],
                 skip: frozenset[str] = frozenset()) -> list[Problem]:
    """Parts of one partition with a row whose ``text_sha256`` is not its probe item's now.

    ``current`` maps item ids to their text hashes (:func:`probe_text_hashes`); parts whose shard id is in
    ``skip`` (already reported missing or corrupt) are not read. Reads only the item_id and text_sha256 columns.
    """
    d = _partition(store, manifest)
    live = replace(manifest, parts=[p for p in manifest.parts if p.shard_id not in skip])
    rows_by_shard = committed_item_ids(store, live)
    problems = []
    for p in live.parts:
        rows = rows_by_shard[p.shard_id]
        where = (manifest.model, manifest.release, manifest.probe_set, p.shard_id, f"{d}/{p.file}")
        if any(h is None for h in rows.values()):
            problems.append(Problem(*where, "no_text_hash", f"its {len(rows)} rows carry no text_sha256 (written "
                                    "before normaudit recorded which text was embedded): they cannot be "
                                    "checked against the probe items and the views hide them"))
            continue
        gone = sorted(i for i in rows if i not in current)
        changed = sorted(i for i, h in rows.items() if i in current and current[i] != h)
        if changed or gone:
            said = [f"{len(changed)} row(s) embedded from a text the probe item no longer has"] if changed else []
            said += [f"{len(gone)} row(s) of items no longer in the probe set"] if gone else []
            problems.append(Problem(*where, "stale_text", f"{' and '.join(said)} (e.g. item_id "
                                    f"{(changed or gone)[:3]}); the views hide them"))
    return problems


def verify_root(store: Store, depth: str = "sha256", texts: bool = False, leftovers: bool = False) -> VerifyReport:
    """Check every committed part under the root; parts are read one at a time.

    ``texts``: also check every row's ``text_sha256`` against its probe item's (:func:`verify_texts`).
    ``leftovers``: also list ``.tmp-*`` files (:func:`find_leftovers`: one listing of the whole root, so
    ``normaudit verify`` asks for it, not every catalog that opens).
    """
    report = VerifyReport(depth)
    sizes = _sizes(store) if depth == "size" else None
    current: dict[str, dict[str, str]] = {}
    listed: set[str] = set()
    for m in store.manifests():
        report.partitions += 1
        report.parts += len(m.parts)
        listed.update(f"{_partition(store, m)}/{p.file}" for p in m.parts)
        problems = verify_manifest(store, m, depth, sizes)
        report.problems.extend(problems)
        if texts:
            if m.probe_set not in current:
                current[m.probe_set] = probe_text_hashes(store, m.probe_set)
            report.problems.extend(verify_texts(store, m, current[m.probe_set],
                                                frozenset(p.shard_id for p in problems)))
    report.orphans = [rel for rel in store.glob("embeddings/*/*/*/part-*.parquet") if rel not in listed]
    report.leftovers = find_leftovers(store) if leftovers else []
    return report


@contextmanager
def release_lease(store: Store, model: str, release: str, ttl_s: float = lease.DEFAULT_TTL_S) -> Iterator[lease.Lease]:
    """Hold a release's lease for a repair of it (:class:`~pipeline.storage.lease.LeaseHeldError` while a live run
    holds it, naming that run); released on exit. Check the lease (:func:`pipeline.storage.lease.check`) before
    each change, so a repair never changes a release another run took over meanwhile."""
    run = "verify-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]
    try:
        held = lease.acquire(store, model, release, run, ttl_s)
    except lease.LeaseHeldError as exc:
        cur = lease.current_lease(store, model, release)
        holder = cur.describe() if cur is not None else "another run"
        raise lease.LeaseHeldError(
            f"{model} release {release!r} is held by {holder}, which may still commit its written parts: nothing "
            "of that release was changed; rerun `normaudit verify --repair` once that run has ended") from exc
    try:
        yield held
    finally:
        lease.release(store, model, release, held)


def _release_of(rel: str) -> tuple[str, str] | None:
    """The (model, release) of a path under ``embeddings/`` or ``token_norms/``, else None."""
    parts = rel.split("/")
    if len(parts) > 3 and parts[0] in ("embeddings", "token_norms") and parts[1].startswith("model=") \
            and parts[2].startswith("release="):
        return parts[1].removeprefix("model="), parts[2].removeprefix("release=")
    return None


def remove_orphans(store: Store, orphans: list[str], ttl_s: float = lease.DEFAULT_TTL_S
                   ) -> tuple[list[str], list[str]]:
    """Remove orphan part files, each release under its (fenced) lease.

    Returns (removed, refusals): a release a live run holds is left alone (that run may still commit them), and
    its refusal names the run.
    """
    by_release: dict[tuple[str, str], list[str]] = {}
    for rel in orphans:
        if (owner := _release_of(rel)) is not None:  # a folder not named model=/release= is no release's: left
            by_release.setdefault(owner, []).append(rel)
    removed, refused = [], []
    for (model, release), files in sorted(by_release.items()):
        try:
            with release_lease(store, model, release, ttl_s) as held:
                lease.check(store, held, model, release)  # still ours: nobody took it over since
                listed = {f"{_partition(store, m)}/{p.file}" for m in store.manifests(model, release) for p in m.parts}
                for rel in files:
                    if rel not in listed:  # committed meanwhile by a run that has since ended: keep it
                        store.rm(rel)
                        removed.append(rel)
        except lease.LeaseHeldError as exc:
            refused.append(str(exc))
    return removed, refused


def find_leftovers(store: Store) -> list[str]:
    """Temporary files of a write that never finished (``.tmp-*``: its process was killed), relative to the root."""
    found = store.retry(lambda: store.fs.find(store.base), "list the root") if store.exists("") else []
    prefix = store.base + "/"
    rels = (f[len(prefix):] if f.startswith(prefix) else f for f in found)
    return sorted(r for r in rels if r.rsplit("/", 1)[-1].startswith(".tmp-"))


def remove_leftovers(store: Store, files: list[str], ttl_s: float = lease.DEFAULT_TTL_S
                     ) -> tuple[list[str], list[str]]:
    """Remove ``.tmp-*`` leftovers. Those of a release's folders go under its lease (a live run of it may be
    writing them: refused, naming it); the others only once older than ``ttl_s`` (a write in flight is younger).

    Returns (removed, refusals).
    """
    removed, refused = [], []
    by_release: dict[tuple[str, str], list[str]] = {}
    now = time.time()
    for rel in files:
        owner = _release_of(rel)
        if owner is not None:
            by_release.setdefault(owner, []).append(rel)
        elif now - _modified(store, rel) > ttl_s:
            store.rm(rel)
            removed.append(rel)
    for (model, release), rels in sorted(by_release.items()):
        try:
            with release_lease(store, model, release, ttl_s) as held:
                lease.check(store, held, model, release)
                for rel in rels:
                    store.rm(rel)
                    removed.append(rel)
        except lease.LeaseHeldError as exc:
            refused.append(str(exc))
    return removed, refused


def _modified(store: Store, rel: str) -> float:
    """Last modification of a file as a POSIX time (now when storage does not say: kept as if in flight)."""
    try:
        info = store.retry(lambda: store.fs.info(store.path(rel)), f"stat {rel}")
    except FileNotFoundError:
        return time.time()
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(mtime, dt.datetime):
        return mtime.timestamp()
    return float(mtime) if mtime is not None else time.time()


def raise_if_corrupt(store: Store, problems: list[Problem]) -> None:
    """Raise :class:`CorruptPartError` naming the files and the command that repairs them."""
    if not problems:
        return
    listed = "; ".join(f"{store.url(p.file)} ({p.kind}: {p.detail})" for p in problems[:5])
    more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
    raise CorruptPartError(
        f"{len(problems)} committed part(s) do not match their manifest: {listed}{more}. Run "
        f"`normaudit verify --root {store.root_url} --repair` to move them to quarantine and drop them from "
        "their manifest; the next audit of that release re-embeds them."
    )


def repair(store: Store, problems: list[Problem], ttl_s: float = lease.DEFAULT_TTL_S) -> str:
    """Quarantine the parts with problems and drop them from their manifests; returns the quarantine folder.

    This holds for every kind, the text kinds included: a ``stale_text`` or ``no_text_hash`` part is moved
    whole (its current rows too) to ``quarantine/verify-<time>/<model>/<release>/<probe_set>/`` beside a
    ``.problem.txt``, so nothing of it stays committed and the next audit of that release re-embeds its
    shard with the texts of now. Each release is changed under its (fenced) lease, so a running audit of it is
    never raced: a release a live run holds is left as it is, and :class:`~pipeline.storage.lease.LeaseHeldError`
    names that run once the other releases are repaired.
    """
    run = "verify-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    folder = f"quarantine/{run}"
    by_partition: dict[tuple[str, str, str], list[Problem]] = {}
    for p in problems:
        by_partition.setdefault((p.model, p.release, p.probe_set), []).append(p)
    refused = []
    for (model, release, probe_set), probs in by_partition.items():
        try:
            with release_lease(store, model, release, ttl_s) as held:
                _repair_partition(store, held, folder, model, release, probe_set, probs)
        except lease.LeaseHeldError as exc:
            refused.append(str(exc))
    if refused:
        raise lease.LeaseHeldError("; ".join(dict.fromkeys(refused)))
    return folder


def _repair_partition(store: Store, held: lease.Lease, folder: str, model: str, release: str, probe_set: str,
                      probs: list[Problem]) -> None:
    lease.check(store, held, model, release)  # fenced: the manifest is ours to change
    manifest = store.read_manifest(model, release, probe_set)
    bad = {p.shard_id for p in probs}
    manifest.parts = [p for p in manifest.parts if p.shard_id not in bad]
    store.write_manifest(manifest)  # readers stop seeing the parts before they move
    for p in probs:
        dest = f"{folder}/{model}/{release}/{probe_set}/{p.file.rsplit('/', 1)[-1]}"
        if p.kind != "missing":
            store.move(p.file, dest)
        store.write_bytes_atomic(dest + ".problem.txt", f"{p.kind}: {p.detail}\n".encode())
