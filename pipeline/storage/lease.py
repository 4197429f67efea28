"""One writer per model release: a fenced lease taken before any embedding, checked before every commit.

Two audits of the same (model, release) would otherwise race on the manifest (read, add a
part, write back: the slower writer drops the faster one's part) or mix two sets of weights.
The lease is a sequence of generation files ``leases/model=<m>/release=<r>/<gen>.json``;
the highest generation is the current lease. Taking the lease means *creating* generation
``current + 1`` with a conditional create (``link(2)`` locally, ``If-None-Match: *`` on S3), so
of two runs that race for the same generation exactly one succeeds.

**Fencing.** A run keeps the :class:`Lease` that :func:`acquire` returned (its generation and a random
token) from start to end. Before every commit and every renewal, :func:`check` reads the current (highest)
generation and requires it to be exactly that one, by generation and token, and not released; otherwise it
raises :class:`LeaseLostError` and the run commits nothing more. Comparing with the highest generation, not
looking for ``gen + 1``, holds however many takeovers happened (older generations are deleted). Nothing takes
a lease again in the middle of a run: a run that lost it stops.

**Heartbeats.** A live run renews its lease on a timer (:class:`Heartbeat`, every quarter of the TTL) from the
process that holds it, so it does not lapse during a long preparation or a shard that embeds for hours.

A lease is free when its holder released it, when it was not renewed within its TTL, or when
its holder process is gone (same host, pid no longer alive): a crashed audit does not block the
release for long.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import psutil

from pipeline.names import check_name
from pipeline.storage.store import Store

DEFAULT_TTL_S = 600.0  # the default of Settings.lease_ttl_s; a live run renews every quarter of it
_log = logging.getLogger(__name__)


class LeaseHeldError(RuntimeError):
    """Another live run holds the release's lease; the message names it and what to do."""


class LeaseLostError(RuntimeError):
    """This run's lease is no longer the current one (it lapsed and another run took it over): nothing more is
    committed by this run."""


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

    def is_holding(self, other: Lease | None) -> bool:
        """Whether ``other`` (the current generation read from storage) is this very holding, unreleased."""
        return other is not None and (other.gen, other.token) == (self.gen, self.token) and not other.released

    def describe(self) -> str:
        """Who holds it, for messages: run, host, pid and since when."""
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.acquired_at))
        return f"run {self.run_id} (host {self.host}, pid {self.pid}) since {since}"


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
    """Take the release's lease for ``run_id``, or raise :class:`LeaseHeldError` naming the live holder.

    Re-entrant only while the run's own generation is still the current one; the caller keeps the returned
    lease and hands it to :func:`check` before each commit.
    """
    for _ in range(5):
        cur = current_lease(store, model, release)
        if cur is not None and cur.run_id == run_id and not cur.released:
            return cur
        if cur is not None and not cur.free():
            expires = time.strftime("%H:%M:%S UTC", time.gmtime(cur.renewed_at + cur.ttl_s))
            raise LeaseHeldError(
                f"{model} release {release!r} is being audited by {cur.describe()}; this run stops before "
                f"embedding anything. Wait for that run, or audit under another --release. If that run is dead, "
                f"its lease expires at {expires}, or delete {store.url(lease_dir(model, release))} to free it now."
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


def check(store: Store, held: Lease, model: str, release: str, renew: bool = False) -> Lease:
    """Raise :class:`LeaseLostError` unless ``held`` is still the current generation (by generation and token).

    Renews it (its ``renewed_at`` written now) when ``renew`` or when a quarter of its TTL has passed.
    """
    cur = current_lease(store, model, release)
    if not held.is_holding(cur):
        now_held = "nobody holds it now" if cur is None or cur.released else f"it is held by {cur.describe()}"
        raise LeaseLostError(
            f"run {held.run_id} lost the lease of {model} release {release!r} (generation {held.gen}; "
            f"{now_held}): it lapsed, or another run took it over; nothing more is committed by this run, and its "
            "written parts stay invisible. Rerun the audit: committed shards are kept and skipped, written ones "
            "are checked and reused."
        )
    now = time.time()
    if renew or now - held.renewed_at > held.ttl_s / 4:
        held.renewed_at = cur.renewed_at = now
        store.write_bytes_atomic(_gen_path(model, release, held.gen), cur.to_json())
    return held


def release(store: Store, model: str, release_label: str, held: Lease) -> bool:
    """Mark the lease released if ``held`` is still the current generation; True if it was."""
    cur = current_lease(store, model, release_label)
    if not held.is_holding(cur):
        return False
    cur.released = True
    store.write_bytes_atomic(_gen_path(model, release_label, cur.gen), cur.to_json())
    return True


class Heartbeat:
    """Renews a held lease every quarter of its TTL on a daemon thread, from start to :meth:`stop`.

    It runs in the process that holds the lease (the flow's), so the lease lives exactly as long as that
    process keeps going: through the preparation of a probe set and through a shard that embeds for hours.
    A loss found while renewing stops the beats and is kept in :attr:`lost`; :meth:`raise_if_lost` raises it.
    A renewal that fails for another reason (an outage) is logged and tried again at the next beat.
    """

    def __init__(self, store: Store, held: Lease, model: str, release_label: str) -> None:
        self.store, self.held, self.model, self.release = store, held, model, release_label
        self.interval_s = held.ttl_s / 4
        self.lost: LeaseLostError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-heartbeat-{held.run_id}", daemon=True)

    def start(self) -> Heartbeat:
        """Start the beats; returns self."""
        self._thread.start()
        return self

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """End the beats (waits for one in progress)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def raise_if_lost(self) -> None:
        """Raise the :class:`LeaseLostError` a beat found, if any."""
        if self.lost is not None:
            raise self.lost

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                check(self.store, self.held, self.model, self.release, renew=True)
            except LeaseLostError as exc:
                self.lost = exc
                return
            except Exception as exc:  # noqa: BLE001 - a storage outage: the next beat tries again within the TTL
                _log.warning("the lease of %s release %r was not renewed (%s: %s); retrying in %.0f s",
                             self.model, self.release, type(exc).__name__, exc, self.interval_s)
