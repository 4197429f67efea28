"""One writer per model release: a lease taken before any embedding, checked before every commit.

Two audits of the same (model, release) would otherwise race on the manifest (read, add a
part, write back: the slower writer drops the faster one's part) or mix two sets of weights.
The lease is a sequence of generation files ``leases/model=<m>/release=<r>/<gen>.json``;
the highest generation is the current lease. Taking the lease means *creating* generation
``current + 1`` with a conditional create (``link(2)`` locally, ``If-None-Match: *`` on S3), so
of two runs that race for the same generation exactly one succeeds. A generation file is only
ever rewritten by its holder (renewal, release), and files are never reused, so a holder keeps
the lease exactly as long as generation ``gen + 1`` does not exist: that is the check before
each commit (one GET).

A lease is free when its holder released it, when it was not renewed within its TTL, or when
its holder process is gone (same host, pid no longer alive): a crashed audit does not block the
release for long.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass

import psutil

from pipeline.names import check_name
from pipeline.storage.store import Store

DEFAULT_TTL_S = 3600.0  # renewed at every commit; a shard that embeds for longer than this needs more


class LeaseHeldError(RuntimeError):
    """Another live run holds the release's lease; the message names it and what to do."""


class LeaseLostError(RuntimeError):
    """This run's lease was taken over (it expired) before a commit: the commit is refused."""


@dataclass
class Lease:
    """One generation of a release's lease."""

    run_id: str
    gen: int
    token: str
    host: str
    pid: int
    pid_started: float
    acquired_at: float
    renewed_at: float
    ttl_s: float
    released: bool = False

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    def free(self, now: float | None = None) -> bool:
        """True when another run may take over: released, expired, or its process is gone."""
        now = time.time() if now is None else now
        return self.released or now > self.renewed_at + self.ttl_s or _holder_gone(self)


def process_started(pid: int) -> float | None:
    """Start time of a local process, None if there is none; ``inf`` when it cannot be inspected."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # alive but not ours to inspect: never take its lease for dead
        return float("inf")


def holder_alive(host: str, pid: int, pid_started: float | None) -> bool:
    """Whether process ``pid`` started at ``pid_started`` on ``host`` may still run (True for other hosts)."""
    if host != socket.gethostname():
        return True  # cannot see other hosts' processes: rely on the TTL
    started = process_started(pid)
    if started == float("inf"):
        return True
    # a recycled pid has another start time
    return started is not None and (pid_started is None or abs(started - pid_started) <= 1.0)


def _holder_gone(lease: Lease) -> bool:
    return not holder_alive(lease.host, lease.pid, lease.pid_started)


def lease_dir(model: str, release: str) -> str:
    """Folder of a release's lease generations, relative to the root."""
    check_name(model, "model name")
    check_name(release, "release label")
    return f"leases/model={model}/release={release}"


def _gen_path(model: str, release: str, gen: int) -> str:
    return f"{lease_dir(model, release)}/{gen:010d}.json"


def current_lease(store: Store, model: str, release: str) -> Lease | None:
    """The highest generation of the release's lease, or None if it was never taken."""
    # another process may have written a generation since: never trust a cached listing here
    store.fs.invalidate_cache(store.path(lease_dir(model, release)))
    for rel in reversed(store.glob(f"{lease_dir(model, release)}/*.json")):  # sorted: zero-padded generations
        try:
            return Lease(**json.loads(store.read_bytes(rel)))
        except FileNotFoundError:  # cleaned up between listing and reading: look at the next one
            continue
    return None


def acquire(store: Store, model: str, release: str, run_id: str, ttl_s: float = DEFAULT_TTL_S) -> Lease:
    """Take the release's lease for ``run_id`` (re-entrant), or raise :class:`LeaseHeldError`."""
    for _ in range(5):
        cur = current_lease(store, model, release)
        if cur is not None and cur.run_id == run_id and not cur.released:
            return cur
        if cur is not None and not cur.free():
            since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cur.acquired_at))
            expires = time.strftime("%H:%M:%S UTC", time.gmtime(cur.renewed_at + cur.ttl_s))
            raise LeaseHeldError(
                f"{model} release {release!r} is being audited by run {cur.run_id} (host {cur.host}, pid "
                f"{cur.pid}) since {since}; this run stops before embedding anything. Wait for that run, or "
                f"audit under another --release. If that run is dead, its lease expires at {expires}, or "
                f"delete {store.url(lease_dir(model, release))} to free it now."
            )
        gen = (cur.gen if cur else 0) + 1
        now = time.time()
        pid = os.getpid()
        lease = Lease(run_id, gen, uuid.uuid4().hex, socket.gethostname(), pid,
                      process_started(pid) or now, now, now, ttl_s)
        if store.create_exclusive(_gen_path(model, release, gen), lease.to_json()):
            for old in store.glob(f"{lease_dir(model, release)}/*.json"):
                if old < _gen_path(model, release, gen):
                    store.rm(old)  # history is not needed: only the highest generation counts
            return lease
        # another run created this generation first: look again (it is most likely live now)
    raise LeaseHeldError(f"could not take the lease of {model} release {release!r}: it changed hands 5 times "
                         "while trying; another audit of this release is starting. Retry later.")


def check(store: Store, lease: Lease, model: str, release: str) -> Lease:
    """Raise :class:`LeaseLostError` unless ``lease`` is still current; renew it when a quarter is used."""
    try:
        store.read_bytes(_gen_path(model, release, lease.gen + 1))
    except FileNotFoundError:
        pass
    else:
        raise LeaseLostError(
            f"run {lease.run_id} lost the lease of {model} release {release!r} (another run took it over "
            "after it expired); nothing more is committed by this run. Rerun the audit: committed shards "
            "are kept and skipped."
        )
    now = time.time()
    if now - lease.renewed_at > lease.ttl_s / 4:
        lease.renewed_at = now
        store.write_bytes_atomic(_gen_path(model, release, lease.gen), lease.to_json())
    return lease


def ensure(store: Store, model: str, release: str, run_id: str) -> Lease:
    """The run's current lease, taken now if it has none; checked as by :func:`check`."""
    cur = current_lease(store, model, release)
    lease = cur if cur is not None and cur.run_id == run_id and not cur.released else None
    if lease is None:
        return acquire(store, model, release, run_id)
    return check(store, lease, model, release)


def release(store: Store, model: str, release_label: str, run_id: str) -> bool:
    """Mark the run's lease released (if it still holds it); True if it did."""
    cur = current_lease(store, model, release_label)
    if cur is None or cur.run_id != run_id or cur.released:
        return False
    cur.released = True
    store.write_bytes_atomic(_gen_path(model, release_label, cur.gen), cur.to_json())
    return True
