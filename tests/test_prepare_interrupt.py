"""Ctrl-C while a large probe file is being prepared stops the audit within 10 s, at any size.

The file is prepared block by block by tasks on the workers (pipeline/audit/prepare.py), never by a process
that outlives them: the interrupt stops the run as it does mid-embedding. The user's CLI, in a subprocess, in a
fresh process group and a user's environment (no PREFECT_API_URL).
"""

from __future__ import annotations

import subprocess
import time

import polars as pl
import psutil
import pytest

from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store
from tests.test_interrupts import (
    BIN,
    LIMIT_S,
    assert_only_our_lines,
    gone_within,
    interrupt_and_wait,
    the_run,
    user_env,
)

ROWS, BLOCK = 400_000, 4096  # ~100 blocks: about half a minute of preparation on two cores


@pytest.fixture(scope="module")
def large_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("large") / "large.csv"
    pl.DataFrame({"item_id": [f"s{i}" for i in range(ROWS)],
                  "text": [f"sentence number {i} of the set" for i in range(ROWS)]}).write_csv(path)
    return str(path)


def audit(tmp_path, model, probes: str, root: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "normaudit"), "audit", "--model", str(model), "--probes", probes, "--root", root, "--release", "r"],
        env=user_env(tmp_path, NORMAUDIT_PROBE_BLOCK_ROWS=str(BLOCK)), **popen)


def staged(store: Store) -> list[str]:
    return store.glob("prepare/*/large/items-*.parquet")


@pytest.mark.slow
def test_ctrl_c_during_preparation_stops_within_10s_and_stores_nothing_then_a_rerun_does_it_all(
        tmp_path, tiny_model_dir, large_file):
    root = str(tmp_path / "root")
    store = Store(root)
    err = tmp_path / "audit.err"
    proc = audit(tmp_path, tiny_model_dir, large_file, root, start_new_session=True, stdout=subprocess.DEVNULL,
                 stderr=err.open("w"))
    deadline = time.monotonic() + 300
    while len(staged(store)) < 5:  # a few blocks prepared, most still to do
        assert proc.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "no block was prepared within 300 s"
        time.sleep(0.05)
    children = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    code, took = interrupt_and_wait(proc, err)
    print(f"SIGINT during preparation: exit {code} {took:.2f} s after the signal, {len(staged(store))} blocks staged")
    assert code == 130, err.read_text()[-3000:]
    assert gone_within(children, LIMIT_S - took + 1) == []  # every worker (and so every block task) with it
    assert_only_our_lines(err.read_text())
    assert not store.exists("probes/probe_set=large")  # nothing of the set is stored, nothing half-visible
    left = staged(store)
    time.sleep(2)
    assert staged(store) == left  # nothing is written after the CLI exits
    assert the_run(store)[1] == "interrupted"

    rerun = audit(tmp_path, tiny_model_dir, large_file, root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True)
    out, stderr = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, stderr[-3000:]
    assert f"embedded {ROWS} items" in out
    assert store.glob("prepare/*") == []  # the interrupted run's blocks are swept, the rerun's removed
    con = open_catalog(store)
    assert con.execute("select count(*), count(distinct item_id) from embeddings").fetchall() == [(ROWS, ROWS)]
    assert con.execute("select count(*) from probe_items where probe_set = 'large'").fetchall() == [(ROWS,)]
