"""Interrupts and leftovers, as a user meets them: the installed CLI in its own session, no PREFECT_API_URL.

Ctrl-C (SIGINT to the whole process group, as a terminal sends it) or SIGTERM mid-embedding stops the
audit within 10 s with exit 130, the lease released and the run recorded as interrupted; a SIGKILL of the
CLI leaves no Prefect API or Dask worker process behind, and the run it leaves ``running`` is found abandoned
by ``verify`` and by the next audit, which record it as abandoned.
"""

from __future__ import annotations

import json
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
from pipeline.storage.runs import RunRecord, find_abandoned, run_status, sweep_abandoned, write_run
from pipeline.storage.store import Store
from pipeline.storage.verify import verify_root

BIN = Path(sys.executable).parent
N_ITEMS, SHARD = 400, 8  # 50 shards: embedding lasts long enough to be interrupted mid-way
LIMIT_S = 10.0
OUR_LINES = ("note:", "warning:", "error:", "stopping:")


@pytest.fixture(scope="module")
def many_words(tmp_path_factory) -> str:
    rng = np.random.default_rng(3)
    vocab = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "music", "water"]
    path = tmp_path_factory.mktemp("interrupts") / "words.csv"
    pl.DataFrame({
        "item_id": [f"w{i:04d}" for i in range(N_ITEMS)],
        "text": [" ".join(rng.choice(vocab, size=1 + i % 6)) for i in range(N_ITEMS)],
        "zipf": rng.uniform(1, 7, N_ITEMS).round(2),
    }).write_csv(path)
    return str(path)


def user_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a user's shell: no PREFECT_API_URL, a fresh Prefect home."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), **extra}


def start_audit(tmp_path: Path, model: Path, probes: str, root: str) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / "audit.out", tmp_path / "audit.err"
    proc = subprocess.Popen(
        [str(BIN / "normaudit"), "audit", "--model", str(model), "--probes", probes, "--root", root,
         "--release", "r"],
        env=user_env(tmp_path, NORMAUDIT_SHARD_SIZE=str(SHARD)), start_new_session=True,
        stdout=out.open("w"), stderr=err.open("w"))
    return proc, out, err


def interrupt_and_wait(proc: subprocess.Popen, err: Path, sig: int = signal.SIGINT, to_group: bool = True,
                       twice: bool = False, what: str = "the audit") -> tuple[int, float]:
    """Send ``sig`` to the CLI's process group (or to the CLI alone), ``twice`` 0.3 s apart if asked; return its exit
    code and the seconds from the signal to the exit. Past LIMIT_S the group is killed and the test fails."""
    sent = time.monotonic()
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    if twice:  # an impatient user: the second Ctrl-C must neither be needed nor cut the cleanup short
        time.sleep(0.3)
        os.killpg(proc.pid, sig)
    try:
        code = proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"{what} did not stop within {LIMIT_S} s:\n{err.read_text()[-3000:]}") from None
    return code, time.monotonic() - sent


def wait_mid_embedding(proc: subprocess.Popen, store: Store, err: Path) -> list[int]:
    """Wait until two shards are committed (of 50); return the CLI's child process ids (API, workers)."""
    manifest = "embeddings/model=tiny/release=r/probe_set=words/_manifest.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if store.exists(manifest) and len(json.loads(store.read_bytes(manifest))["parts"]) >= 2:
            return [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        if proc.poll() is not None:
            raise AssertionError(f"the audit ended before it could be interrupted:\n{err.read_text()[-3000:]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("no shard was committed within 300 s")


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still running (zombies count as gone) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def assert_only_our_lines(stderr: str) -> None:
    """Nothing but the CLI's own lines: no library's log line or warning (Dask's cancelled instructions, the
    resource tracker's leaked semaphore), however the interrupt caught the workers."""
    foreign = [line for line in stderr.splitlines() if line.strip() and not line.startswith(OUR_LINES)]
    assert foreign == [], foreign


def the_run(store: Store) -> tuple[str, str, str]:
    (row,) = open_catalog(store).execute("select run_id, status, message from runs").fetchall()
    return row


def assert_committed_parts_intact(store: Store) -> int:
    assert verify_root(store, "sha256").ok
    (manifest,) = store.manifests()
    rows = sum(p.rows for p in manifest.parts)
    assert open_catalog(store).execute("select count(*), count(distinct item_id) from embeddings").fetchall() \
        == [(rows, rows)]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("sig, to_group, twice", [(signal.SIGINT, True, False), (signal.SIGTERM, False, False),
                                                  (signal.SIGINT, True, True)],
                         ids=["sigint-to-the-group", "sigterm-to-the-cli", "sigint-twice"])
def test_interrupt_mid_embedding_stops_cleanly_within_10s(tmp_path, tiny_model_dir, many_words, sig, to_group,
                                                          twice):
    root = str(tmp_path / "root")
    store = Store(root)
    proc, out, err = start_audit(tmp_path, tiny_model_dir, many_words, root)
    children = wait_mid_embedding(proc, store, err)
    assert any("flows.parent_watch" in " ".join(psutil.Process(p).cmdline()) for p in children)  # the API
    code, took = interrupt_and_wait(proc, err, sig, to_group, twice)
    print(f"{signal.Signals(sig).name}{' twice' if twice else ''}: exit {code} {took:.2f} s after the signal")
    stderr = err.read_text()
    assert code == 130, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is recorded as interrupted" in errors[0], errors
    assert "Traceback" not in stderr + out.read_text()
    assert gone_within(children, LIMIT_S - took + 1) == []  # the API and the workers stopped with it
    assert_only_our_lines(err.read_text())  # read again: the resource tracker warns after the CLI exits

    run_id, status, message = the_run(store)
    assert status == "interrupted" and signal.Signals(sig).name in message
    held = lease.current_lease(store, "tiny", "r")
    assert held.run_id == run_id and held.released
    done = assert_committed_parts_intact(store)
    assert 0 < done < N_ITEMS
    if sig is not signal.SIGINT or twice:
        return
    # the lease is free: the same audit runs again at once and embeds only the rest, and finishes quietly
    again = subprocess.run(
        [str(BIN / "normaudit"), "audit", "--model", str(tiny_model_dir), "--probes", many_words, "--root", root,
         "--release", "r"], env=user_env(tmp_path, NORMAUDIT_SHARD_SIZE=str(SHARD)), capture_output=True,
        text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"embedded {N_ITEMS - done} items" in again.stdout
    assert "Future exception was never retrieved" not in again.stderr and "Traceback" not in again.stderr
    assert assert_committed_parts_intact(store) == N_ITEMS


@pytest.mark.slow
def test_ctrl_c_while_a_worker_s_child_runs_the_analyses_stops_it_too(tmp_path, tiny_model_dir, many_words):
    """The analyses run in a child process of a worker (pipeline/audit/release_steps.py); Ctrl-C then stops the
    run within 10 s as mid-embedding, and the child ends with its worker instead of analysing on, re-parented."""
    root = str(tmp_path / "root")
    proc, _, err = start_audit(tmp_path, tiny_model_dir, many_words, root)
    deadline, child = time.monotonic() + 300, None
    while child is None and time.monotonic() < deadline and proc.poll() is None:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "pipeline.audit.child" in cmd and cmd[-1] == "analyse":
                child = p
        time.sleep(0.02)
    if child is None:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"no child process ran the analyses:\n{err.read_text()[-3000:]}")
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    code, took = interrupt_and_wait(proc, err)
    print(f"SIGINT during the analyses: exit {code} {took:.2f} s after the signal")
    stderr = err.read_text()
    assert code == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error:")] != []
    assert gone_within([child.pid], LIMIT_S - took + 1) == []  # the analyses' child stopped with its worker
    assert gone_within(tree, 1) == []
    assert the_run(Store(root))[1] == "interrupted"


@pytest.mark.slow
def test_sigkill_of_the_cli_leaves_no_process_and_verify_repairs_the_abandoned_run(tmp_path, tiny_model_dir,
                                                                                   many_words):
    root = str(tmp_path / "root")
    store = Store(root)
    proc, _, err = start_audit(tmp_path, tiny_model_dir, many_words, root)
    children = wait_mid_embedding(proc, store, err)
    assert len(children) >= 2  # the temporary API and at least one Dask worker
    os.kill(proc.pid, signal.SIGKILL)  # the CLI alone: no handler of it runs
    proc.wait(timeout=10)
    alive = gone_within(children, LIMIT_S)
    assert alive == [], [psutil.Process(p).cmdline() for p in alive]

    run_id, status, _ = the_run(store)
    assert status == "running"  # nothing could record its end
    orphans = verify_root(store, "size").orphans  # parts written but not yet committed when it died (if any)
    out = subprocess.run([str(BIN / "normaudit"), "verify", "--root", root], env=user_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"abandoned: run {run_id} (tiny @ r)" in out.stderr, out.stderr
    assert all(f"orphan: {store.url(o)}" in out.stderr for o in orphans), out.stderr
    assert "is gone" in out.stderr and verify_root(store, "size").orphans == orphans  # verify alone changes nothing
    out = subprocess.run([str(BIN / "normaudit"), "verify", "--root", root, "--repair"], env=user_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "1 abandoned run(s) recorded as abandoned" in out.stdout, out.stdout
    assert the_run(store)[1] == "abandoned" and not store.exists(f"runs/running/{run_id}.json")
    assert verify_root(store, "size").orphans == []  # its release's lease was free: --repair removed them
    # its lease was free (its holder is gone): --repair took it to remove the orphans, and so can the next run
    assert lease.acquire(store, "tiny", "r", "next-run").gen >= 2
    assert_committed_parts_intact(store)


def _leave_a_dead_run(root: str, run_id: str) -> None:
    """A process that records a run as running and dies without ending it (as after SIGKILL)."""
    code = (
        "import sys; from pipeline.storage.runs import RunRecord, write_run; from pipeline.storage.store import Store; "
        f"s = Store({root!r}); write_run(s, RunRecord({run_id!r}, 'm', 'r0', 'f' * 64, 'p', {{}}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_run_whose_process_is_gone_is_abandoned_and_swept(tmp_path):
    root = str(tmp_path / "root")
    store = Store(root)
    _leave_a_dead_run(root, "dead-run")
    live = RunRecord("live-run", "m", "r1", "f" * 64, "p", {})
    write_run(store, live)  # this process: alive, so never swept
    found = {r.run_id: r for r in find_abandoned(store)}
    assert set(found) == {"dead-run"} and "is gone" in found["dead-run"].reason
    sweep_abandoned(store, list(found.values()))
    assert run_status(store, "dead-run") == "abandoned" and run_status(store, "live-run") == "running"
    assert store.glob("runs/running/*") == ["runs/running/live-run.json"]
    live.status = "completed"
    write_run(store, live)
    assert find_abandoned(store) == []  # it recorded its end: nothing is left to sweep


def test_a_run_of_another_host_is_abandoned_only_when_its_lease_expired(tmp_path):
    store = Store(str(tmp_path / "root"))
    now = time.time()
    held = lease.acquire(store, "m", "r", "far-run", ttl_s=60)
    marker = {"run_id": "far-run", "model": "m", "release": "r", "host": "another-host", "pid": 1,
              "pid_started": 0.0, "started_at": now}
    store.write_bytes_atomic("runs/running/far-run.json", json.dumps(marker).encode())
    assert find_abandoned(store) == []  # its lease is fresh: it may be working
    held.renewed_at = now - 120  # not renewed for two minutes with a one-minute TTL
    store.write_bytes_atomic(f"{lease.lease_dir('m', 'r')}/{held.gen:010d}.json", held.to_json())
    (found,) = find_abandoned(store)
    assert found.run_id == "far-run" and "lease expired" in found.reason


@pytest.mark.slow
def test_the_next_audit_of_any_release_sweeps_abandoned_runs(tmp_path, tiny_model_dir, prefect_api):
    from flows.audit import run_audit
    from pipeline.settings import load_settings

    root = str(tmp_path / "root")
    _leave_a_dead_run(root, "dead-run")
    probes = tmp_path / "few.csv"
    pl.DataFrame({"item_id": ["a", "b", "c", "d"], "text": ["dog", "cat", "tree", "river"],
                  "zipf": [3.0, 4.0, 5.0, 6.0]}).write_csv(probes)
    run_audit(load_settings(root=root), str(tiny_model_dir), [str(probes)], release="other")
    store = Store(root)
    assert run_status(store, "dead-run") == "abandoned" and store.glob("runs/running/*") == []


def session_processes(sid: int) -> list[psutil.Process]:
    """Every live process of the CLI's session: the CLI, its workers and its API (in a group of its own)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            pass
    return found


def blocks_sigint(pid: int) -> bool:
    """Whether the process holds SIGINT blocked (Linux /proc), i.e. a terminal's Ctrl-C never reaches it."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"no SigBlk in /proc/{pid}/status")


def wait_for_phase(proc: subprocess.Popen, phase: str, root: Path, err: Path) -> float:
    """Wait until the audit reaches ``phase``; return the seconds since it started."""
    started, deadline = time.monotonic(), time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the audit ended before {phase}:\n{err.read_text()[-3000:]}")
        elapsed = time.monotonic() - started
        if phase.endswith("s") and elapsed >= float(phase[:-1]):
            return elapsed
        if phase == "pre-flight" and "note: " in err.read_text():  # the pre-flight says what it inferred
            return elapsed
        if phase == "first-worker-spawned":
            workers = [p for p in psutil.Process(proc.pid).children()
                       if "multiprocessing.spawn" in " ".join(p.cmdline())]
            if workers:
                if sys.platform == "linux":  # from its first instruction: it never dies of the Ctrl-C
                    assert blocks_sigint(workers[0].pid)
                return elapsed
        if phase == "run-registered" and list((root / "runs" / "running").glob("*.json")):
            return elapsed
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"{phase} not reached within 300 s")


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["pre-flight", "4s", "first-worker-spawned", "run-registered"])
def test_ctrl_c_at_start_up_exits_130_within_10s_and_leaves_nothing(tmp_path, tiny_model_dir, many_words, phase):
    """Group SIGINT while the CLI checks its inputs, boots the API, starts its workers or loads the probes."""
    root = tmp_path / "root"
    proc, out, err = start_audit(tmp_path, tiny_model_dir, many_words, str(root))
    at = wait_for_phase(proc, phase, root, err)
    code, took = interrupt_and_wait(proc, err, what=f"Ctrl-C at {phase}: the audit")
    print(f"Ctrl-C at {phase} ({at:.1f} s after start): exit {code} {took:.2f} s later")
    stderr = err.read_text()
    assert code == 130, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "interrupted" in errors[0], stderr[-3000:]
    assert "Traceback" not in stderr + out.read_text()
    deadline = time.monotonic() - took + LIMIT_S  # LIMIT_S from the signal
    while (left := session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [p.cmdline() for p in left]  # no API, no worker, no nanny restart survives it
    assert_only_our_lines(err.read_text())

    store = Store(str(root))
    if "is recorded as interrupted" in errors[0]:
        run_id, status, message = the_run(store)
        assert status == "interrupted" and "SIGINT" in message and run_id in errors[0]
        held = lease.current_lease(store, "tiny", "r")
        assert held is None or (held.run_id == run_id and held.released)
    else:  # before the run was registered: the message says so, and the store holds no run
        assert "nothing was" in errors[0], errors
        assert phase != "run-registered"
        assert not store.exists("runs/running") or store.glob("runs/running/*") == []


_WORKER_CLOSED_MID_TASK = """
import logging, sys, time
from flows.console import quiet_console
if __name__ == "__main__":
    if sys.argv[1] == "quiet":
        quiet_console()  # as the CLI does before Dask is imported
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.WARNING) as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        running = client.submit(time.sleep, 60)
        while not any(client.processing().values()):
            time.sleep(0.05)
        time.sleep(1)  # it runs; leaving the block closes the worker under it
"""


@pytest.mark.slow
def test_a_worker_closed_mid_task_logs_nothing_under_the_quiet_console(tmp_path):
    """What an interrupt does to a local worker: closed while its task runs. Dask then logs the cancelled
    instruction at WARNING (the control shows it does); the CLI's quiet console keeps that off the terminal."""
    script = tmp_path / "close_mid_task.py"
    script.write_text(_WORKER_CLOSED_MID_TASK)
    env = {k: v for k, v in os.environ.items() if k not in ("DASK_DISTRIBUTED__LOGGING", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    runs = {mode: subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                                 timeout=120) for mode in ("plain", "quiet")}
    assert all(r.returncode == 0 for r in runs.values()), {m: r.stderr[-2000:] for m, r in runs.items()}
    assert "distributed.worker.state_machine - WARNING" in runs["plain"].stderr, runs["plain"].stderr[-2000:]
    assert "distributed." not in runs["quiet"].stderr, runs["quiet"].stderr[-2000:]


def test_a_signal_a_library_wrapped_in_its_own_error_is_still_an_interrupt():
    """CI: SIGTERM reached Prefect's handler (a flow runs) while pydantic serialized Prefect's settings, and came
    out as PydanticSerializationError; the CLI took it for a failure (exit 1) instead of an interrupt (130)."""
    from prefect.exceptions import TerminationSignal
    from pydantic import BaseModel, model_serializer

    from flows.interrupts import interrupt_in, is_interrupt

    class Settings(BaseModel):
        @model_serializer
        def serialize(self):
            raise TerminationSignal(signal.SIGTERM)

    with pytest.raises(Exception) as caught:
        Settings().model_dump()
    assert not isinstance(caught.value, (KeyboardInterrupt, TerminationSignal))  # the library's own error
    assert is_interrupt(caught.value)
    assert interrupt_in(caught.value).signal == signal.SIGTERM  # what the run record names
    assert interrupt_in(ValueError("a failure")) is None


_SECOND_CTRL_C_AT_TEARDOWN = """
import os, signal, sys, time

import typer

from flows.interrupts import interruptible


class SecondCtrlCAtTeardown:
    # Its __del__ runs while Python tears down its modules: after the exit handlers, when Python has put back
    # the default action of every signal that had a Python handler.
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # a signal is acted on at once; the sleep only leaves it time


keeper = SecondCtrlCAtTeardown()
app = typer.Typer()


@app.command()
@interruptible
def main():
    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, as the terminal sends it
    time.sleep(5)


app()
"""


def test_a_second_ctrl_c_while_python_tears_down_still_exits_130(tmp_path):
    """CI: an impatient second Ctrl-C 0.3 s after the first landed after the one error line, while Python tore
    its modules down, and killed the CLI by the signal (a parent saw -2, not 130)."""
    script = tmp_path / "second_ctrl_c.py"
    script.write_text(_SECOND_CTRL_C_AT_TEARDOWN)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == ["error: interrupted; nothing was recorded yet"], done.stderr


_CTRL_C_INSIDE_A_SERIALIZER = """
import os, signal, sys, time

import typer
from pydantic import BaseModel, model_serializer

from flows.interrupts import interruptible


class Settings(BaseModel):
    @model_serializer
    def serialize(self):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C lands while pydantic serializes
        time.sleep(5)
        return {}


app = typer.Typer()


@app.command()
@interruptible
def main(control: bool = False):
    if control:  # the library's own error, not a KeyboardInterrupt, is what comes out of the serializer
        try:
            Settings().model_dump()
        except Exception as exc:
            print(type(exc).__name__)
            raise typer.Exit(0) from None
    Settings().model_dump()


app()
"""


def test_ctrl_c_that_a_library_wraps_in_its_own_error_before_a_run_exists_exits_130(tmp_path):
    """CI: Ctrl-C 4 s into an audit landed inside a pydantic serializer (before the run was registered), came out
    as PydanticSerializationError and the CLI exited 1 with a traceback instead of 130."""
    script = tmp_path / "ctrl_c_in_serializer.py"
    script.write_text(_CTRL_C_INSIDE_A_SERIALIZER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    control = subprocess.run([sys.executable, str(script), "--control"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert control.stdout.strip() == "PydanticSerializationError", control.stdout + control.stderr[-2000:]
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == ["error: interrupted; nothing was recorded yet"], done.stderr


def test_a_termination_signal_pydantic_kept_only_by_name_is_an_interrupt():
    """pydantic-core may turn Prefect's TerminationSignal raised in a serializer into an error without a cause
    (CI: SIGTERM to the CLI mid-embedding exited 1 with this line): it is still an interrupt; other
    serialization errors are not. It is recorded as SIGTERM."""
    from pydantic_core import PydanticSerializationError

    from flows.interrupts import is_interrupt, signal_name

    lost = PydanticSerializationError("Error calling function `_ser_model`: TerminationSignal: ")
    assert is_interrupt(lost)
    assert signal_name(lost) == "SIGTERM"  # Prefect raises it for SIGTERM only (CI recorded "by SIGINT" before)
    assert not is_interrupt(PydanticSerializationError("Error calling function `_ser_model`: ValueError: bad"))
