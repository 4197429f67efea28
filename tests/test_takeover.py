"""No lost commit under takeover: a run whose lease lapsed and was taken over commits nothing more, whoever took it
(an audit, ``verify --repair``, once or twice), and a live run's heartbeat keeps its lease through a long shard.

Run A is an audit's own steps in this process (real tiny model, real storage), so the test decides when its lease
lapses and when it commits; the takers are the installed CLI, as users run it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import psutil
import pytest

from pipeline.storage import lease
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from pipeline.storage.verify import verify_root

BIN = Path(sys.executable).parent
WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "table", "chair"]
SHARD, N_ITEMS = 16, 64  # four shards
TTL_S = 0.5  # run A's lease: lapses while the test waits


@pytest.fixture
def probes(tmp_path) -> str:
    rng = np.random.default_rng(11)
    path = tmp_path / "takeover.csv"
    pl.DataFrame({"item_id": [f"i{i:03d}" for i in range(N_ITEMS)],
                  "text": [" ".join(rng.choice(WORDS, size=1 + i % 4)) for i in range(N_ITEMS)],
                  "zipf": rng.uniform(1, 7, N_ITEMS).round(2)}).write_csv(path)
    return str(path)


def _cli(*args: str, tmp_path: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # as a user runs it
    env.update(NORMAUDIT_SHARD_SIZE=str(SHARD), COLUMNS="200", PREFECT_HOME=str(tmp_path / "prefect-home"),
               **env_extra)
    return subprocess.run([str(BIN / "normaudit"), *args], env=env, capture_output=True, text=True, timeout=600)


class RunA:
    """An audit's steps driven one by one: take the lease, plan, embed every shard (parts written), commit some."""

    def __init__(self, root: str, model_dir: Path, probes: str) -> None:
        from pipeline.audit import steps
        from pipeline.audit.context import AuditContext
        from pipeline.settings import load_settings

        self.steps = steps
        settings = load_settings(root=root, shard_size=SHARD, lease_ttl_s=TTL_S)
        self.ctx = AuditContext(settings, "tiny", "r", "run-a", steps.resolve(str(model_dir)))
        self.held = steps.open_release(self.ctx)
        self.plan = steps.prepare_probes(self.ctx, probes)
        self.template = steps.manifest_template(self.ctx, self.plan.name)
        assert len(self.plan.refs) == N_ITEMS // SHARD

    def embed(self, i: int):
        return self.steps.embed_shard(self.ctx, self.plan.refs[i], self.template)

    def commit(self, parts) -> int:
        return self.steps.commit_batch(self.ctx, self.held, self.template, parts)


def _assert_exactly_once(store: Store, tmp_path: Path) -> None:
    """Every item committed once, no manifest naming a missing file, and ``normaudit verify`` ok."""
    report = verify_root(store, "sha256", texts=True)
    assert report.ok, report.problems  # no manifest names a missing or changed file
    ids = [r[0] for r in open_catalog(store).execute("select item_id from embeddings").fetchall()]
    assert len(ids) == N_ITEMS and len(set(ids)) == N_ITEMS
    out = _cli("verify", "--root", store.root_url, tmp_path=tmp_path)
    assert out.returncode == 0 and "ok: every committed part matches" in out.stdout, out.stdout + out.stderr


@pytest.mark.slow
def test_a_run_whose_lease_was_taken_twice_by_another_audit_commits_nothing_more(tmp_path, tiny_model_dir, probes):
    root = str(tmp_path / "root")
    store = Store(root)
    a = RunA(root, tiny_model_dir, probes)
    parts = [a.embed(i) for i in range(4)]  # all four written; only the first committed before the lease lapses
    assert a.commit(parts[:1]) == SHARD
    time.sleep(TTL_S + 0.2)
    # two takeovers, so A's generation + 1 is gone when A tries again (the old check looked only for it)
    assert lease.release(store, "tiny", "r", lease.acquire(store, "tiny", "r", "run-between"))
    audit = _cli("audit", "--model", str(tiny_model_dir), "--probes", probes, "--root", root, "--release", "r",
                 tmp_path=tmp_path)
    assert audit.returncode == 0, audit.stderr[-3000:]
    assert lease.current_lease(store, "tiny", "r").gen == a.held.gen + 2
    # the audit took A's written parts as orphans, checked them and committed each once
    assert "embedded 48 items (1 shards already committed; 3 written by an interrupted run, checked and reused)" \
        in audit.stdout, audit.stdout
    before = store.read_manifest("tiny", "r", "takeover")
    with pytest.raises(lease.LeaseLostError, match="run run-a lost the lease"):
        a.commit(parts[1:])
    assert store.read_manifest("tiny", "r", "takeover") == before  # A changed nothing
    _assert_exactly_once(store, tmp_path)


@pytest.mark.slow
def test_a_run_whose_lease_verify_repair_took_twice_commits_nothing_and_the_rerun_reuses_its_part(
        tmp_path, tiny_model_dir, probes):
    root = str(tmp_path / "root")
    store = Store(root)
    a = RunA(root, tiny_model_dir, probes)
    parts = [a.embed(i) for i in range(3)]
    assert a.commit(parts[:1]) == SHARD
    time.sleep(TTL_S + 0.2)
    repaired = _cli("verify", "--root", root, "--repair", tmp_path=tmp_path)  # takeover 1: A's pending parts go
    assert repaired.returncode == 0 and "repaired: 2 orphan part(s) removed" in repaired.stdout, repaired.stdout
    a.embed(1)  # A goes on working: its part 1 written again, an orphan again
    repaired = _cli("verify", "--root", root, "--repair", tmp_path=tmp_path)  # takeover 2
    assert repaired.returncode == 0 and "repaired: 1 orphan part(s) removed" in repaired.stdout, repaired.stdout
    assert lease.current_lease(store, "tiny", "r").gen == a.held.gen + 2
    late = a.embed(2)  # written after the second repair: it stays, for the rerun to reuse
    with pytest.raises(lease.LeaseLostError, match="nobody holds it now"):
        a.commit([parts[1], late])
    manifest = store.read_manifest("tiny", "r", "takeover")
    assert [p.shard_id for p in manifest.parts] == [parts[0].info.shard_id]  # nothing of A's failed batch
    assert verify_root(store, "sha256").ok  # no manifest names a file a repair removed
    rerun = _cli("audit", "--model", str(tiny_model_dir), "--probes", probes, "--root", root, "--release", "r",
                 tmp_path=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "embedded 48 items (1 shards already committed; 1 written by an interrupted run, checked and reused)" \
        in rerun.stdout, rerun.stdout
    assert late.info in store.read_manifest("tiny", "r", "takeover").parts  # A's last part, committed once
    _assert_exactly_once(store, tmp_path)


def _workers(cli: psutil.Process) -> list[psutil.Process]:
    """The local Dask cluster's processes under the CLI (everything but the Prefect API's process tree)."""
    found = []
    for child in cli.children():
        if "prefect" in " ".join(child.cmdline()):
            continue
        found += [child, *child.children(recursive=True)]
    return found


@pytest.mark.slow
def test_a_shard_longer_than_the_ttl_keeps_its_lease_and_a_concurrent_repair_refuses(tmp_path, tiny_model_dir,
                                                                                    probes):
    root = str(tmp_path / "root")
    store = Store(root)
    ttl = 2.0
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(NORMAUDIT_SHARD_SIZE=str(SHARD), NORMAUDIT_LEASE_TTL_S=str(ttl), COLUMNS="200",
               PREFECT_HOME=str(tmp_path / "prefect-home"))
    err = tmp_path / "audit.err"
    proc = subprocess.Popen([str(BIN / "normaudit"), "audit", "--model", str(tiny_model_dir), "--probes", probes,
                             "--root", root, "--release", "r"], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=err.open("w"), text=True)
    try:
        deadline = time.monotonic() + 300
        while (held := lease.current_lease(store, "tiny", "r")) is None:  # the run has taken its lease
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.05)
        workers = _workers(psutil.Process(proc.pid))
        assert workers, "no local Dask worker found"
        for w in workers:  # every shard now lasts as long as the test likes: the flow alone keeps going
            w.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3 * ttl)
            # an orphan for the repair to remove: it needs the release's lease
            d = store.embeddings_dir("tiny", "r", "takeover")
            stray = f"{d}/part-{'a' * 20}-{'b' * 16}.parquet"
            store.write_bytes_atomic(stray, b"not committed")
            repaired = _cli("verify", "--root", root, "--repair", tmp_path=tmp_path)
            now = lease.current_lease(store, "tiny", "r")
            assert (now.gen, now.token) == (held.gen, held.token) and not now.free()  # renewed, never lapsed
        finally:
            for w in workers:
                w.send_signal(signal.SIGCONT)
        assert repaired.returncode == 1, repaired.stdout + repaired.stderr
        error = [line for line in repaired.stderr.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and f"held by run {held.run_id}" in error[0], repaired.stderr
        assert store.exists(stray)  # nothing of the live run's release was removed
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err.read_text()[-3000:]
    assert f"embedded {N_ITEMS} items" in out, out
    assert not store.exists(stray)  # the audit's own sweep removed it once every shard was committed
    _assert_exactly_once(store, tmp_path)


@pytest.mark.slow
def test_an_audit_with_limit_keeps_the_orphans_a_later_full_audit_reuses(tmp_path, tiny_model_dir, probes):
    root = str(tmp_path / "root")
    store = Store(root)
    a = RunA(root, tiny_model_dir, probes)
    written = [a.embed(i) for i in range(4)]  # a run killed before its first commit: four orphans
    assert lease.release(store, "tiny", "r", a.held)
    limited = _cli("audit", "--model", str(tiny_model_dir), "--probes", probes, "--root", root, "--release", "r",
                   "--limit", "20", tmp_path=tmp_path)
    assert limited.returncode == 0, limited.stderr[-3000:]
    d = store.embeddings_dir("tiny", "r", "takeover")
    # shard 0 was reused; the orphans of the shards past the limit (the cut one's whole shard too) are still there
    assert all(store.exists(f"{d}/{p.info.file}") for p in written[1:])
    assert {p.shard_id for p in store.read_manifest("tiny", "r", "takeover").parts} >= {written[0].info.shard_id}
    from pipeline.audit.context import AuditContext

    plan = a.steps.prepare_probes(AuditContext(a.ctx.settings, "tiny", "r", "run-full", a.ctx.resolved), probes)
    assert plan.reusable == 3 and len(plan.refs) == 3  # what the next full audit checks and commits as they are
