"""The release lease on real storage: exclusive, re-entrant, taken over only when free, fenced at commit."""

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
    assert lease.release(store, "m", "r1", "run-a")
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
    with pytest.raises(LeaseLostError, match="lost the lease"):
        lease.check(store, old, "m", "r")
    assert lease.ensure(store, "m", "r", "run-new").token == new.token
    assert not lease.release(store, "m", "r", "run-old")  # only the holder releases


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
