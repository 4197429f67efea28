"""The scale-out commit path: workers write parts under their final names, the flow commits them in batches.

A part written but never committed (its run killed in between) is an orphan: invisible to every reader, listed by
``normaudit verify``, reused by the next audit when its bytes still match its name, removed by ``--repair``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from flows.window import completed_in_window
from pipeline.audit.batches import BatchCommitter
from pipeline.storage import lease
from pipeline.storage.catalog import open_catalog
from pipeline.storage.parts import PART_NAME, WrittenPart, commit_parts, embeddings_table, encode_table, write_part
from pipeline.storage.shards import split_shards
from pipeline.storage.store import Manifest, PartInfo, Store, sha256_bytes
from pipeline.storage.verify import verify_root
from tests.helpers import FakeResult, word_probe_set

BIN = Path(sys.executable).parent
WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "table", "chair"]


# ---------------------------------------------------------------- the window and the batches (no cluster)
def test_window_never_holds_more_than_its_size_and_yields_every_item_once():
    running, peak, lock = [0], [0], threading.Lock()

    def work(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01 * (i % 3))
        with lock:
            running[0] -= 1
        return i * i

    with cf.ThreadPoolExecutor(8) as pool:
        done = [d for d in completed_in_window(lambda i: pool.submit(work, i), range(40), lambda: 3, lambda: None)]
    assert sorted(i for i, _ in done) == list(range(40))
    assert all(f.result() == i * i for i, f in done)
    assert peak[0] <= 3


def test_window_yields_none_when_a_deadline_passes_with_nothing_finished():
    release = threading.Event()
    with cf.ThreadPoolExecutor(1) as pool:
        deadline = [time.monotonic() + 0.05]
        gen = completed_in_window(lambda i: pool.submit(release.wait), [0], lambda: 1,
                                  lambda: max(0.0, deadline[0] - time.monotonic()) if deadline else None)
        assert next(gen) is None  # the caller's batch is due: it gets control back without a finished task
        deadline.clear()
        release.set()
        item, fut = next(gen)
        assert item == 0 and fut.result() is True


def _part(i: int, rows: int = 10) -> WrittenPart:
    return WrittenPart(PartInfo(f"{i:020x}", f"part-{i:020x}-{'0' * 16}.parquet", rows, "0" * 64, i * rows), "w")


def test_batches_commit_by_count_and_by_age():
    now = [0.0]
    commits: list[list[str]] = []
    batches = BatchCommitter(lambda parts: commits.append([p.info.shard_id for p in parts]) or 10 * len(parts),
                             max_parts=3, max_wait_s=5.0, clock=lambda: now[0])
    assert [batches.add(_part(i)) for i in range(3)] == [0, 0, 30]  # the third fills the batch
    assert len(commits) == 1 and batches.wait_s() is None
    batches.add(_part(3))
    now[0] = 4.0
    assert not batches.due() and batches.wait_s() == pytest.approx(1.0)
    now[0] = 5.0
    assert batches.due() and batches.add(_part(4)) == 20  # the oldest waited 5 s: both go
    assert [len(c) for c in commits] == [3, 2] and batches.batches == 2 and batches.rows == 50
    assert batches.flush() == 0  # nothing waits


def test_a_batch_whose_commit_failed_stays_pending_for_the_retry():
    attempts: list[list[str]] = []

    def commit(parts):
        attempts.append([p.info.shard_id for p in parts])
        if len(attempts) == 1:
            raise OSError("storage went away")
        return 10 * len(parts)

    batches = BatchCommitter(commit, max_parts=2)
    batches.add(_part(0))
    with pytest.raises(OSError):
        batches.add(_part(1))
    assert [p.info.shard_id for p in batches.pending] == attempts[0]  # nothing dropped: the flow retries them
    assert batches.flush() == 20 and attempts[1] == attempts[0] and batches.pending == []


# ---------------------------------------------------------------- storage: batches, supersession, the lease
def _written(store: Store, ps, shard, seed: int = 0) -> WrittenPart:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(shard.size, 4)).astype(np.float32)
    res = FakeResult(v, np.linalg.norm(v.astype(np.float64), axis=1), np.full(shard.size, 3),
                     np.zeros(shard.size, bool))
    table = embeddings_table("m", "r", shard, res)
    return WrittenPart(write_part(store, "m", "r", shard, encode_table(table), table.num_rows), ps.name)


def test_one_manifest_write_commits_a_batch_and_a_written_part_is_invisible_until_then(tmp_path):
    store = Store(str(tmp_path / "root"))
    ps = word_probe_set("w", 40, {"zipf": np.arange(40.0)})
    from pipeline.probes import write_probe_tables

    write_probe_tables(store, ps)
    template = Manifest("m", "r", "w", "f" * 64, {}, 4, "float32")
    parts = [_written(store, ps, s, i) for i, s in enumerate(split_shards("w", ps.items, "f" * 64, {}, 10))]
    for p in parts:  # final, content-addressed names: shard id and the start of the bytes' sha256
        m = PART_NAME.match(p.info.file)
        data = store.read_bytes(f"{store.embeddings_dir('m', 'r', 'w')}/{p.info.file}")
        assert m["shard"] == p.info.shard_id and sha256_bytes(data).startswith(m["sha"]) and len(data) == p.info.size
    assert open_catalog(store).execute("select count(*) from embeddings").fetchone() == (0,)
    assert len(verify_root(store, "sha256").orphans) == 4  # written, not committed: listed, never read
    commit_parts(store, template, parts[:3])
    assert open_catalog(store).execute("select count(*) from embeddings").fetchone() == (30,)
    report = verify_root(store, "sha256", texts=True)
    assert report.ok and report.parts == 3 and [o.rsplit("/", 1)[1] for o in report.orphans] == [parts[3].info.file]


def test_a_commit_without_the_lease_is_refused_and_changes_nothing(tmp_path, tiny_model_dir):
    from pipeline.audit import steps
    from pipeline.audit.context import AuditContext
    from pipeline.probes import write_probe_tables
    from pipeline.settings import load_settings

    root = str(tmp_path / "root")
    store = Store(root)
    ps = word_probe_set("w", 20, {"zipf": np.arange(20.0)})
    write_probe_tables(store, ps)
    shards = split_shards("w", ps.items, "f" * 64, {}, 10)
    ctx_a = AuditContext(load_settings(root=root), "m", "r", "run-a", steps.resolve(str(tiny_model_dir)))
    template = Manifest("m", "r", "w", "f" * 64, {}, 4, "float32")
    held = steps.open_release(ctx_a)
    assert steps.commit_batch(ctx_a, held, template, [_written(store, ps, shards[0])]) == 10
    ctx_b = AuditContext(ctx_a.settings, "m", "r", "run-b", ctx_a.resolved)
    before = store.read_bytes(f"{store.embeddings_dir('m', 'r', 'w')}/_manifest.json")
    with pytest.raises(lease.LeaseHeldError):  # a second audit of the release gets no lease to commit under
        steps.open_release(ctx_b)
    # run-a's lease ends (released here, as a TTL expiry would) and run-c takes the release: run-a's next batch is
    # refused and the manifest stays as it was
    lease.release(store, "m", "r", held)
    lease.acquire(store, "m", "r", "run-c")
    with pytest.raises(lease.LeaseLostError):
        steps.commit_batch(ctx_a, held, template, [_written(store, ps, shards[1])])
    assert store.read_bytes(f"{store.embeddings_dir('m', 'r', 'w')}/_manifest.json") == before
    assert open_catalog(store).execute("select count(*) from embeddings").fetchone() == (10,)


# ---------------------------------------------------------------- a kill between write and commit, end to end
def _cli(*args: str, tmp_path: Path, shard: int = 16) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # as a user runs it
    env.update(NORMAUDIT_SHARD_SIZE=str(shard), COLUMNS="200", PREFECT_HOME=str(tmp_path / "prefect-home"))
    return subprocess.run([str(BIN / "normaudit"), *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_orphans_of_a_killed_commit_are_invisible_listed_and_reused_by_the_rerun(tmp_path, tiny_model_dir):
    rng = np.random.default_rng(5)
    probes = tmp_path / "orphans.csv"
    pl.DataFrame({"item_id": [f"i{i:03d}" for i in range(64)],
                  "text": [" ".join(rng.choice(WORDS, size=1 + i % 4)) for i in range(64)],
                  "zipf": rng.uniform(1, 7, 64).round(2)}).write_csv(probes)
    root = str(tmp_path / "root")
    args = ("audit", "--model", str(tiny_model_dir), "--probes", str(probes), "--root", root, "--release", "r")
    first = _cli(*args, tmp_path=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    store = Store(root)
    d = store.embeddings_dir("tiny", "r", "orphans")
    manifest = store.read_manifest("tiny", "r", "orphans")
    assert len(manifest.parts) == 4
    norms = dict(open_catalog(store).execute("select item_id, norm from embeddings").fetchall())
    # the state a SIGKILL leaves between a worker's write and the flow's commit: two parts on storage that the
    # manifest does not list (the flow held them in its batch); one of them torn by the kill
    dropped = manifest.parts[1:3]
    manifest.parts = [p for p in manifest.parts if p not in dropped]
    store.write_manifest(manifest)
    torn = f"{d}/{dropped[1].file}"
    store.write_bytes_atomic(torn, store.read_bytes(torn)[:100])
    assert open_catalog(store).execute("select count(*) from embeddings").fetchone() == (32,)  # nothing half-visible

    verify = _cli("verify", "--root", root, tmp_path=tmp_path)
    assert verify.returncode == 0, verify.stderr  # an orphan is not corruption: no reader sees it
    assert all(f"orphan: {store.url(d, p.file)}" in verify.stderr for p in dropped), verify.stderr

    again = _cli(*args, tmp_path=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    # the intact orphan is checked and committed as it was; the torn one is removed and its shard embedded again
    assert "embedded 32 items (2 shards already committed; 1 written by an interrupted run, checked and reused)" \
        in again.stdout, again.stdout
    after = store.read_manifest("tiny", "r", "orphans")
    assert dropped[0] in after.parts and len(after.parts) == 4
    rows = open_catalog(store).execute("select item_id, norm from embeddings").fetchall()
    assert len(rows) == 64 and len({r[0] for r in rows}) == 64
    assert all(abs(norms[i] - n) < 1e-5 for i, n in rows)  # the re-embedded shard gives the same norms
    report = verify_root(store, "sha256", texts=True)
    assert report.ok and report.orphans == []  # reused or swept: no file outside the manifest remains


# ---------------------------------------------------------------- a large set is prepared in a child process
def test_run_in_child_returns_its_value_and_raises_its_error():
    from pipeline.audit.child import run_in_child

    assert run_in_child(divmod, 17, 5) == (3, 2)
    with pytest.raises(ValueError, match="invalid literal"):
        run_in_child(int, "not a number")


def _worker_and_child_env(name: str) -> tuple[str | None, str | None]:
    from pipeline.audit.child import run_in_child

    return os.environ.get(name), run_in_child(os.getenv, name)


def test_a_child_of_a_dask_worker_runs_without_the_workers_malloc_trimming():
    """Dask's nanny gives its workers MALLOC_TRIM_THRESHOLD_ (memory handed back as it is freed); a step's child
    must not inherit it (it mapped and unmapped every large numpy array: the analyses 1.6 x slower), and keeps
    the rest of the worker's environment (here the nanny's OMP_NUM_THREADS)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        trim = client.submit(_worker_and_child_env, "MALLOC_TRIM_THRESHOLD_", pure=False).result(timeout=120)
        omp = client.submit(_worker_and_child_env, "OMP_NUM_THREADS", pure=False).result(timeout=120)
    assert trim[0] is not None and trim[1] is None, trim
    assert omp[0] is not None and omp[1] == omp[0], omp


def test_a_child_ends_when_its_parent_is_killed():
    """A worker killed mid-step (the cluster's shutdown after Ctrl-C, the OOM killer) takes the step's child with it:
    the child watches its parent (pipeline.lifeline) instead of running on, re-parented, for minutes."""
    import psutil

    parent = subprocess.Popen([sys.executable, "-c", "import time\nfrom pipeline.audit.child import run_in_child\n"
                               "run_in_child(time.sleep, 600)"], cwd=Path(__file__).resolve().parents[1])
    deadline, children = time.monotonic() + 60, []
    while not children and time.monotonic() < deadline:
        children = [c for c in psutil.Process(parent.pid).children()
                    if "pipeline.audit.child" in " ".join(c.cmdline())]
        time.sleep(0.05)
    assert children, "run_in_child started no child process"
    parent.kill()
    parent.wait()
    started = time.monotonic()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"the child outlived its killed parent by 10 s: {alive}"
    assert time.monotonic() - started < 3  # the watch polls twice a second; SIGTERM ends a sleeping child


def test_a_large_probe_set_is_prepared_in_a_child_process_with_the_same_plan(tmp_path, tiny_model_dir, monkeypatch):
    from pipeline.audit import preflight, steps
    from pipeline.audit.child import run_in_child
    from pipeline.audit.context import AuditContext
    from pipeline.settings import load_settings

    rng = np.random.default_rng(1)
    probes = tmp_path / "child.csv"
    pl.DataFrame({"item_id": [f"i{i:03d}" for i in range(40)],
                  "text": [" ".join(rng.choice(WORDS, size=1 + i % 3)) for i in range(40)]}).write_csv(probes)
    settings = load_settings(root=str(tmp_path / "root"), shard_size=16)
    ctx = AuditContext(settings, "m", "r", "run-1", steps.resolve(str(tiny_model_dir)))
    inline = steps.prepare_probes(ctx, str(probes))
    children = []
    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_BYTES", 1)
    monkeypatch.setattr(steps, "CHILD_PROCESS_BYTES", 1)
    monkeypatch.setattr(steps, "run_in_child", lambda fn, *a: children.append(fn) or run_in_child(fn, *a))
    in_child = steps.prepare_probes(ctx, str(probes))
    assert children == [steps._prepare]  # it went through a child process
    assert in_child == inline and [r.size for r in in_child.refs] == [16, 16, 8]


# ---------------------------------------------------------------- leftovers of a killed write
def test_tmp_leftovers_are_listed_and_repair_sweeps_them_but_not_a_write_in_flight(tmp_path):
    from tests.helpers import store_synthetic

    root = str(tmp_path / "root")
    store = Store(root)
    store_synthetic(store, "m", "r", word_probe_set("w", 20, {"zipf": np.arange(20.0)}), np.linspace(1, 2, 20),
                    shard_size=10)
    in_release = f"{store.embeddings_dir('m', 'r', 'w')}/.tmp-{'1' * 32}"  # a worker killed mid-write
    old = f"runs/.tmp-{'2' * 32}"  # a run record's write killed an hour ago
    fresh = f"reports/.tmp-{'3' * 32}"  # a write in flight right now
    for rel in (in_release, old, fresh):
        store.write_bytes_atomic(rel, b"half")
    os.utime(store.path(old), (time.time() - 7200, time.time() - 7200))
    out = _cli("verify", "--root", root, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert all(f"leftover: {store.url(rel)}" in out.stderr for rel in (in_release, old, fresh)), out.stderr
    out = _cli("verify", "--root", root, "--repair", tmp_path=tmp_path)
    assert out.returncode == 0 and "repaired: 2 leftover file(s) removed; 1 kept" in out.stdout, out.stdout
    assert not store.exists(in_release) and not store.exists(old) and store.exists(fresh)
    assert verify_root(store, "sha256").ok and lease.current_lease(store, "m", "r").released  # taken, given back
