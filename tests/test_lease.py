"""The release lease on real storage: exclusive, re-entrant, taken over only when free, fenced at every commit and
renewal (by generation and token, however many takeovers happened), kept alive by a heartbeat."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from pipeline.storage import lease
from pipeline.storage.lease import LeaseHeldError, LeaseLostError
from pipeline.storage.store import Store


def _store(kind, tmp_path, request) -> Store:
    if kind == "local":
        return Store(str(tmp_path / "root"))
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    return open_store(load_settings(root=request.getfixturevalue("s3_env")))


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    return _store(request.param, tmp_path, request)


def test_second_run_is_refused_while_first_holds(store):
    first = lease.acquire(store, "m", "r1", "run-a")
    assert lease.acquire(store, "m", "r1", "run-a").token == first.token  # re-entrant
    with pytest.raises(LeaseHeldError, match=r"being audited by run run-a .*stops before embedding"):
        lease.acquire(store, "m", "r1", "run-b")
    lease.acquire(store, "m", "other-release", "run-b")  # other releases are independent
    assert lease.release(store, "m", "r1", first)
    second = lease.acquire(store, "m", "r1", "run-b")
    assert second.gen == first.gen + 1
    assert len(store.glob("leases/model=m/release=r1/*.json")) == 1  # older generations cleaned up


def test_racing_runs_get_exactly_one_lease(store):
    winners, refused = [], []
    barrier = threading.Barrier(6)

    def race(i):
        barrier.wait()
        try:
            winners.append(lease.acquire(store, "m", "r", f"run-{i}").run_id)
        except LeaseHeldError:
            refused.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(refused) == 5
    assert lease.current_lease(store, "m", "r").run_id == winners[0]


def test_expired_lease_is_taken_over_and_the_old_holder_cannot_commit(store):
    old = lease.acquire(store, "m", "r", "run-old", ttl_s=0.5)
    lease.check(store, old, "m", "r")  # still current
    time.sleep(0.6)
    new = lease.acquire(store, "m", "r", "run-new")
    assert new.gen == old.gen + 1
    with pytest.raises(LeaseLostError, match=r"run run-old lost the lease .* held by run run-new"):
        lease.check(store, old, "m", "r")
    assert lease.check(store, new, "m", "r").token == new.token
    assert not lease.release(store, "m", "r", old)  # only the holder releases
    assert lease.release(store, "m", "r", new)
    with pytest.raises(LeaseLostError, match="nobody holds it now"):  # released by the taker: still not A's
        lease.check(store, old, "m", "r")


def test_two_takeovers_are_caught_although_the_generation_after_the_holder_is_gone(store):
    old = lease.acquire(store, "m", "r", "run-old", ttl_s=0.5)
    time.sleep(0.6)
    for taker in ("run-1", "run-2"):  # each takes the lapsed or released lease, then releases it
        assert lease.release(store, "m", "r", lease.acquire(store, "m", "r", taker))
    assert lease.current_lease(store, "m", "r").gen == old.gen + 2
    assert not store.exists(f"{lease.lease_dir('m', 'r')}/{old.gen + 1:010d}.json")  # cleaned up by run-2
    with pytest.raises(LeaseLostError, match="generation 1"):
        lease.check(store, old, "m", "r")
    # the holder's own re-acquire does not sneak back in mid-run either: only a fresh acquire by a new run does
    store.rm(lease.lease_dir("m", "r"), recursive=True)  # a user freed it by hand
    with pytest.raises(LeaseLostError):
        lease.check(store, old, "m", "r")


def test_the_same_generation_with_another_token_is_not_the_holders(tmp_path):
    store = Store(str(tmp_path / "root"))
    held = lease.acquire(store, "m", "r", "run-a")
    imposter = lease.Lease(**{**held.__dict__, "token": "0" * 32})
    with pytest.raises(LeaseLostError):
        lease.check(store, imposter, "m", "r")
    assert not lease.release(store, "m", "r", imposter)
    assert lease.check(store, held, "m", "r") is held


def test_a_heartbeat_keeps_a_lease_alive_past_its_ttl(store):
    held = lease.acquire(store, "m", "r", "run-long", ttl_s=1.0)
    with lease.Heartbeat(store, held, "m", "r") as beat:
        time.sleep(2.5)  # a shard that embeds for longer than the TTL
        assert not lease.current_lease(store, "m", "r").free()
        with pytest.raises(LeaseHeldError, match="run run-long"):
            lease.acquire(store, "m", "r", "run-other")
    assert beat.lost is None
    lease.check(store, held, "m", "r")
    time.sleep(1.1)  # beats stopped: now it lapses, and another run may take it over
    assert lease.acquire(store, "m", "r", "run-other").gen == held.gen + 1


def test_a_heartbeat_that_finds_its_lease_taken_stops_and_says_so(tmp_path):
    store = Store(str(tmp_path / "root"))
    held = lease.acquire(store, "m", "r", "run-a", ttl_s=0.4)
    beat = lease.Heartbeat(store, held, "m", "r")
    store.rm(lease.lease_dir("m", "r"), recursive=True)  # taken from it (freed by hand, then taken)
    lease.acquire(store, "m", "r", "run-b")
    beat.start()
    deadline = time.monotonic() + 5
    while beat.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    beat.stop()
    with pytest.raises(LeaseLostError, match="run run-a lost the lease"):
        beat.raise_if_lost()
    assert lease.current_lease(store, "m", "r").run_id == "run-b"  # the beat wrote nothing over run-b's


def test_lease_of_a_dead_process_is_free(tmp_path):
    store = Store(str(tmp_path / "root"))
    code = ("from pipeline.storage.store import Store; from pipeline.storage import lease; "
            f"lease.acquire(Store({str(tmp_path / 'root')!r}), 'm', 'r', 'run-crashed')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # exits without releasing
    assert lease.current_lease(store, "m", "r").run_id == "run-crashed"
    assert lease.acquire(store, "m", "r", "run-next").run_id == "run-next"


def test_names_are_checked_before_they_become_lease_paths(tmp_path):
    with pytest.raises(ValueError, match="invalid release label '../x'"):
        lease.acquire(Store(str(tmp_path / "root")), "m", "../x", "run")
    assert not (tmp_path / "root").exists()
