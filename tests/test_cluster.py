"""Orchestration at scale: an external Dask scheduler with two workers, and resuming an interrupted audit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from flows.audit import run_audit
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def words_csv(tmp_path_factory):
    rng = np.random.default_rng(11)
    vocab = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "music", "water"]
    n = 240
    path = tmp_path_factory.mktemp("p") / "words.csv"
    pl.DataFrame({
        "item_id": [f"w{i:04d}" for i in range(n)],
        "text": [" ".join(rng.choice(vocab, size=1 + i % 6)) for i in range(n)],
        "zipf": rng.uniform(1, 7, n).round(2), "depth": rng.integers(1, 12, n).astype(float),
    }).write_csv(path)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(root: str):
    con = open_catalog(open_store(load_settings(root=root)))
    return con.execute("select item_id, norm, vector from embeddings order by item_id").fetchall()


def _cluster(worker_args: list[list[str]]):
    """`dask scheduler` and one `dask worker` per entry of ``worker_args``, on loopback, as a user would start
    them; yields the scheduler address and stops them all."""
    from prefect.settings import PREFECT_API_URL

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for extra in worker_args:
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--no-dashboard",
             "--preload", "pipeline.embedding.warmup", *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(len(worker_args), timeout=120)
        yield address
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


@pytest.fixture
def external_cluster(prefect_api):
    """An external scheduler with two plain workers."""
    yield from _cluster([[], []])


@pytest.fixture
def gpu_labelled_cluster(prefect_api):
    """An external scheduler with one worker declaring a GPU resource (a label: this machine has no GPU,
    the worker runs on its CPU) and one without."""
    yield from _cluster([["--name", "gpu-worker", "--resources", "GPU=1"], ["--name", "cpu-worker"]])


def test_external_scheduler_gives_same_results_as_local(tmp_path, tiny_model_dir, words_csv, external_cluster):
    local_root, remote_root = str(tmp_path / "local"), str(tmp_path / "remote")
    common = {"shard_size": 32}
    local = run_audit(load_settings(root=local_root, **common), str(tiny_model_dir), [words_csv],
                      release="r")
    remote_settings = load_settings(root=remote_root, dask_address=external_cluster, **common)
    remote = run_audit(remote_settings, str(tiny_model_dir), [words_csv], release="r")
    assert remote.embedded_items == local.embedded_items == {"words": 240}
    # eight shards over two workers, yet each worker process loaded the model once
    from distributed import Client

    def loaded_models():
        from pipeline.embedding.embed import _EMBEDDERS

        return len(_EMBEDDERS)

    with Client(external_cluster) as client:
        assert sorted(client.run(loaded_models).values()) in ([0, 1], [1, 1])
    assert _rows(remote_root) == _rows(local_root)
    keys = ["probe_set", "property", "statistic"]
    assert remote.results.sort(keys).select([*keys, "n"]).equals(local.results.sort(keys).select([*keys, "n"]))
    assert np.allclose(remote.results.sort(keys)["value"], local.results.sort(keys)["value"], atol=1e-12)


def test_interrupted_audit_resumes_with_only_the_missing_shards(tmp_path, tiny_model_dir, words_csv, prefect_api):
    root = str(tmp_path / "root")
    env = {**os.environ, "NORMAUDIT_SHARD_SIZE": "8", "NORMAUDIT_ROOT": root}
    env.pop("PREFECT_API_URL", None)  # the child starts its own temporary API, like a user's run
    log = open(tmp_path / "audit.log", "w")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen([str(BIN / "normaudit"), "audit", "--model", str(tiny_model_dir), "--probes",
                             words_csv, "--release", "r"], env=env, start_new_session=True,
                            stdout=log, stderr=subprocess.STDOUT)
    store = open_store(load_settings(root=root))
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            m = store.read_manifest("tiny", "r", "words") if store.exists(
                "embeddings/model=tiny/release=r/probe_set=words/_manifest.json") else None
            if m is not None and len(m.parts) >= 3:
                break
            if proc.poll() is not None:
                raise AssertionError("the audit ended before it could be interrupted:\n"
                                     + (tmp_path / "audit.log").read_text()[-3000:])
            time.sleep(0.05)
        else:
            raise AssertionError("no shard was committed within 180 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole audit: CLI, Prefect API and Dask workers
        proc.wait(timeout=30)
        log.close()
    committed = store.read_manifest("tiny", "r", "words")
    done_rows = sum(p.rows for p in committed.parts)
    assert 0 < done_rows < 240
    summary = run_audit(load_settings(root=root, shard_size=8), str(tiny_model_dir), [words_csv], release="r")
    assert summary.embedded_items == {"words": 240 - done_rows}
    assert summary.skipped_shards == {"words": len(committed.parts)}
    con = open_catalog(store)
    assert con.execute("select count(*), count(distinct item_id) from embeddings").fetchall() == [(240, 240)]


def test_embedding_tasks_need_a_gpu_when_workers_declare_gpus(tmp_path, tiny_model_dir, words_csv,
                                                             gpu_labelled_cluster):
    """Workers started with --resources GPU=1 get every model task; the other worker gets none of them."""
    from distributed import Client

    root = str(tmp_path / "root")
    overrides = {"root": root, "dask_address": gpu_labelled_cluster, "shard_size": 16}
    with Client(gpu_labelled_cluster) as client:
        client.get_task_stream()  # installs the scheduler's task-stream record from here on
        summary = run_audit(load_settings(**overrides), str(tiny_model_dir), [words_csv], release="r")
        stream = client.get_task_stream()
        names = {addr: w["name"] for addr, w in client.scheduler_info(n_workers=-1)["workers"].items()}
    assert summary.embedded_items == {"words": 240}
    model_tasks = [t for t in stream if str(t["key"]).startswith(("embed_shard", "compute_token_norms"))]
    assert len(model_tasks) == 240 // 16 + 1, sorted(str(t["key"]) for t in stream)
    assert {names[t["worker"]] for t in model_tasks} == {"gpu-worker"}
