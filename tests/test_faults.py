"""Faults a cluster and an object store really produce, injected into real audits; no row may be lost.

Each test is one row of docs/reliability.md. Real parts throughout: a local Dask cluster of
processes, Prefect flows on the session's test API, moto's S3 server behind a fault-injecting
proxy on loopback, real Parquet files on disk.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from flows.audit import run_audit
from pipeline.cli.main import app
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import CorruptPartError, Store, open_store
from pipeline.storage.verify import repair, verify_root
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.slow

WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "table", "chair", "window",
         "garden", "mountain", "ocean", "winter", "summer", "doctor", "animal", "flower"]
N_ITEMS, SHARD = 48, 16


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    rng = np.random.default_rng(5)
    rows = [{"item_id": f"i{i:03d}", "text": " ".join(rng.choice(WORDS, size=1 + i % 4)),
             "zipf": float(rng.uniform(1, 7))} for i in range(N_ITEMS)]
    path = tmp_path_factory.mktemp("probes") / "faults.csv"
    pl.DataFrame(rows).write_csv(path)
    return str(path)


@pytest.fixture(scope="module")
def expected_norms(tiny_model_dir, probe_file):
    """Norms of an in-process forward pass: what every audit below must store, row for row."""
    from pipeline.embedding.embed import Embedder
    from pipeline.embedding.models import get_spec, resolve_model

    items = pl.read_csv(probe_file).sort("item_id")
    res = Embedder(resolve_model(get_spec(str(tiny_model_dir)))).embed(items["text"].to_list())
    return dict(zip(items["item_id"].to_list(), res.norms, strict=True))


def _audit(root, model_dir, probe_file, **extra):
    overrides = {"root": root, "shard_size": SHARD, **extra}
    return run_audit(load_settings(**overrides), str(model_dir), [probe_file], release="r1")


def _assert_nothing_lost(store: Store, expected_norms: dict) -> None:
    rows = open_catalog(store).execute("select item_id, norm from embeddings order by item_id").fetchall()
    assert [r[0] for r in rows] == sorted(expected_norms)  # every item, each exactly once
    assert np.allclose([r[1] for r in rows], [expected_norms[r[0]] for r in rows], rtol=1e-5)
    report = verify_root(store, "sha256")
    assert report.ok and report.parts == N_ITEMS // SHARD, report.problems


# ---------------------------------------------------------------- (a) a flaky S3 endpoint
@pytest.fixture
def flaky_s3(s3_server, s3_env, monkeypatch):
    proxy = FaultProxy(s3_server, seed=11, p_error=0.06, p_drop_before=0.03, p_drop_after=0.03, p_slow=0.05,
                       slow_s=(0.1, 0.4)).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)  # workers get it through the settings
    yield proxy, s3_env
    proxy.stop()


def test_flaky_s3_retries_with_backoff_and_loses_nothing(flaky_s3, tiny_model_dir, probe_file, expected_norms,
                                                         prefect_api):
    proxy, root = flaky_s3
    summary = _audit(root, tiny_model_dir, probe_file)
    assert summary.embedded_items == {"faults": N_ITEMS}
    faults = {k: proxy.stats[k] for k in ("error", "drop_before", "drop_after", "slow")}
    assert all(n >= 1 for n in faults.values()), faults  # every kind of fault really happened
    proxy.enabled = False
    _assert_nothing_lost(open_store(load_settings(root=root)), expected_norms)


def test_error_burst_beyond_botocore_is_retried_by_the_store(s3_server, s3_env, monkeypatch):
    proxy = FaultProxy(s3_server).start()
    try:
        proxy.enabled = False
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        store = open_store(load_settings(root=s3_env))
        store.write_bytes_atomic("warm.json", b"{}")
        proxy.stats.clear()
        proxy.force(["error500"] * 7)  # 7 failed attempts: fewer than the store's 10, the only retries
        store.write_bytes_atomic("a/part.json", b"payload")
        assert proxy.stats["error500"] == 7 and proxy.stats["requests"] >= 8
        assert store.read_bytes("a/part.json") == b"payload"
        # a move whose copy and deletes lose their responses still ends with exactly one copy
        store.write_bytes_atomic("staging/p.bin", b"part")
        proxy.force(["forward"] + ["drop_after"] * 6)
        store.move("staging/p.bin", "final/p.bin")
        assert store.read_bytes("final/p.bin") == b"part" and not store.exists("staging/p.bin")
    finally:
        proxy.stop()


# ---------------------------------------------------------------- (b) a worker killed mid-shard
def test_worker_killed_mid_shard(tmp_path, tiny_model_dir, probe_file, expected_norms, prefect_api):
    import logging

    from distributed import Client, LocalCluster

    from flows.runners import prefect_api as api_env

    root = str(tmp_path / "root")
    killed: dict = {}
    done = threading.Event()

    def kill_first_embedding_worker(client: Client) -> None:
        deadline = time.time() + 180
        while time.time() < deadline and not done.is_set():
            try:
                executing = client.run(lambda dask_worker: [str(ts.key) for ts in dask_worker.state.executing])
            except Exception:  # noqa: BLE001 - a worker starting or stopping; look again
                executing = {}
            for addr, keys in executing.items():
                key = next((k for k in keys if "embed_shard" in k), None)
                if key:
                    pid = client.run(os.getpid, workers=[addr])[addr]
                    os.kill(pid, signal.SIGKILL)
                    killed.update(addr=addr, pid=pid, key=key)
                    return
            time.sleep(0.02)

    with api_env():  # worker processes inherit the test API's URL
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR)
    try:
        with Client(cluster) as client:
            killer = threading.Thread(target=kill_first_embedding_worker, args=(client,), daemon=True)
            killer.start()
            try:
                summary = _audit(root, tiny_model_dir, probe_file, dask_address=cluster.scheduler_address)
            finally:
                done.set()
                killer.join(10)
    finally:
        cluster.close()
    assert killed, "no embed_shard task was seen executing, so nothing was killed"
    with pytest.raises(ProcessLookupError):
        os.kill(killed["pid"], 0)  # that worker process is really gone
    assert summary.embedded_items == {"faults": N_ITEMS}
    store = Store(root)
    _assert_nothing_lost(store, expected_norms)
    assert store.glob("quarantine/**") == []


# ---------------------------------------------------------------- (c) a part corrupted after commit
def test_part_corrupted_after_commit_is_detected_and_reembedded(tmp_path, tiny_model_dir, probe_file,
                                                                expected_norms, prefect_api):
    root = str(tmp_path / "root")
    _audit(root, tiny_model_dir, probe_file)
    store = Store(root)
    manifest = store.manifests()[0]
    victim = f"{store.embeddings_dir(manifest.model, manifest.release, manifest.probe_set)}/{manifest.parts[1].file}"
    data = bytearray(store.read_bytes(victim))
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: only the sha256 can tell
    with open(store.path(victim), "r+b") as fh:
        fh.write(bytes(data))
    runner = CliRunner()
    out = runner.invoke(app, ["audit", "--model", str(tiny_model_dir), "--probes", probe_file, "--root", root,
                              "--release", "r1"])
    assert out.exit_code == 1 and victim in out.output and "normaudit verify" in out.output, out.output
    out = runner.invoke(app, ["verify", "--root", root])
    assert out.exit_code == 1 and victim in out.output and "sha256" in out.output
    out = runner.invoke(app, ["verify", "--root", root, "--repair"])
    assert out.exit_code == 0 and "repaired: 1 part(s)" in out.output, out.output
    assert store.glob("quarantine/verify-*/**/*.parquet") != [] and not store.exists(victim)
    assert open_catalog(store).execute("select count(*) from embeddings").fetchall() == [(N_ITEMS - SHARD,)]
    summary = _audit(root, tiny_model_dir, probe_file)
    assert summary.embedded_items == {"faults": SHARD}  # only the repaired shard is embedded again
    _assert_nothing_lost(store, expected_norms)


def test_truncated_part_is_refused_when_the_catalog_opens(tmp_path):
    from tests.helpers import store_synthetic, word_probe_set

    store = Store(str(tmp_path / "root"))
    store_synthetic(store, "m", "r", word_probe_set("w", 20, {"zipf": np.ones(20)}), np.linspace(1, 2, 20),
                    shard_size=10)
    part = store.glob("embeddings/*/*/*/part-*.parquet")[0]
    with open(store.path(part), "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CorruptPartError, match=re.escape(store.url(part)) + r" \(size: 100 bytes"):
        open_catalog(store)
    folder = repair(store, verify_root(store, "size").problems)
    assert store.exists(f"{folder}/m/r/w/{part.rsplit('/', 1)[1]}")
    assert open_catalog(store).execute("select count(*) from embeddings").fetchall() == [(10,)]


# ---------------------------------------------------------------- (d) two audits of one release at once
def test_two_audits_of_one_release_one_wins_the_other_stops_cleanly(tmp_path, tiny_model_dir, probe_file,
                                                                     expected_norms, prefect_api):
    from prefect.settings import PREFECT_API_URL

    root = str(tmp_path / "root")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "NORMAUDIT_SHARD_SIZE": str(SHARD)}
    cmd = [sys.executable, "-m", "pipeline.cli.main", "audit", "--model", str(tiny_model_dir), "--probes", probe_file,
           "--root", root, "--release", "r1", "--workers", "1"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 1], outs
    loser = outs[[p.returncode for p in procs].index(1)]
    assert "is being audited by run" in loser and "stops before embedding anything" in loser, loser
    store = Store(root)
    _assert_nothing_lost(store, expected_norms)
    runs = open_catalog(store).execute("select run_id, status, message from runs order by status").fetchall()
    assert [r[1] for r in runs] == ["completed", "failed"] and "LeaseHeldError" in runs[1][2]
    assert verify_root(store, "size").orphans == []  # the loser wrote no part
    assert store.glob("quarantine/**") == []


# ---------------------------------------------------------------- (e) an unwritable local root
def test_unwritable_root_fails_before_any_embedding_work(tmp_path, probe_file):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the root's parent folder should be")
    started = time.perf_counter()
    # the model path does not exist either: the root must be what the user hears about first
    out = CliRunner().invoke(app, ["audit", "--model", str(tmp_path / "no-model"), "--probes", probe_file,
                                   "--root", str(blocker / "root")])
    assert out.exit_code == 1
    assert f"cannot write to storage root '{blocker / 'root'}'" in out.output and "--root" in out.output
    assert "model" not in out.output.split("cannot write")[0]
    assert time.perf_counter() - started < 30  # no Prefect API, Dask cluster or model was started
