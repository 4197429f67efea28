"""flows/boot.py: the temporary Prefect API and the early local cluster of a CLI run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

from flows.boot import TemporaryAPI, local_cluster_kwargs, start_local_cluster, take_local_cluster
from pipeline.settings import load_settings

pytestmark = pytest.mark.slow


def test_temporary_api_records_flow_and_task_runs(tmp_path):
    """Our own temporary API (spawned before Prefect is imported) stores runs, task runs and their final
    states, though it keeps no event stream. A fresh PREFECT_HOME: nothing from earlier runs is counted."""
    code = textwrap.dedent("""
        import asyncio, os
        from flows.boot import start_api
        api = start_api()
        assert start_api() is api  # one per process
        os.environ["PREFECT_API_URL"] = api.wait()
        from prefect import flow, task
        from prefect.client.orchestration import get_client

        @task
        def add(x):
            return x + 1

        @flow
        def f():
            return add(1) + add(2)

        assert f() == 5

        async def read():
            async with get_client() as client:
                for _ in range(50):  # task runs are recorded from events, asynchronously
                    runs = await client.read_task_runs()
                    if len(runs) == 2 and all(r.state_name == "Completed" for r in runs):
                        break
                    await asyncio.sleep(0.2)
                return [r.state_name for r in runs], [r.state_name for r in await client.read_flow_runs()]

        print(asyncio.run(read()))
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "(['Completed', 'Completed'], ['Completed'])"


def test_temporary_api_is_prefect_server_start_with_public_settings(tmp_path, monkeypatch):
    """The temporary API is Prefect's documented `prefect server start`, configured by public PREFECT_* settings
    only (no double-underscore variable), under the parent watch and in a process group of its own."""
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    api = TemporaryAPI()
    try:
        server = psutil.Process(api.process.pid)
        # Popen returns once exec has closed its pipe, which the kernel does before it sets the new argv:
        # on a loaded machine /proc/PID/cmdline can still read empty for a moment (a CI run caught it).
        deadline = time.monotonic() + 30
        while not (command := server.cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
        watched = command[command.index("flows.parent_watch") + 1:]
        assert watched == [str(os.getpid()), "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                           str(api.port)]
        env = server.environ()
        assert [k for k in env if k.startswith("PREFECT__")] == []
        assert env["PREFECT_SERVER_UI_ENABLED"] == "false" and env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
        assert env["PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED"] == "false"  # no deployments here to schedule
        assert "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED" not in env  # task runs are recorded
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)  # a terminal's Ctrl-C does not reach it
        with urllib.request.urlopen(api.wait(timeout=240) + "/health", timeout=10) as response:
            assert response.status == 200
    finally:
        api.stop()
    assert api.process.poll() is not None


def test_local_cluster_starts_once_and_not_at_all_with_an_address():
    settings = load_settings(n_workers=1)
    assert start_local_cluster(load_settings(dask_address="tcp://127.0.0.1:1")) is None
    first = start_local_cluster(settings)
    assert start_local_cluster(settings) is first  # the CLI's early start is the one the flow takes
    assert take_local_cluster(settings) is first
    cluster = first.result(timeout=120)
    try:
        assert local_cluster_kwargs(settings)["preload"] == ["flows.local_worker", "pipeline.embedding.warmup"]
        cluster.wait_for_workers(1, timeout=120)  # workers join after the scheduler is up
        # a worker registers with the scheduler before its nanny's start returns, and only then does the cluster
        # list the nanny in ``workers`` (CI once read it empty right after wait_for_workers)
        deadline = time.monotonic() + 60
        while not cluster.workers and time.monotonic() < deadline:
            time.sleep(0.05)
        # a lost worker that never comes back fails its tasks after two minutes instead of a wait forever
        assert cluster.scheduler.no_workers_timeout == 120
        # the slower clocks reach the scheduler and the nannies, which live in this process and are built after
        # the scheduler (at Dask's defaults they cost it 5% of a core while the workers compute)
        servers = [cluster.scheduler, *cluster.workers.values()]
        assert [s.periodic_callbacks["tick"].callback_time for s in servers] == [1000, 1000]
        assert [s.periodic_callbacks["monitor"].callback_time for s in servers] == [10000, 10000]
        assert [s.monitor.monitor_disk_io for s in servers] == [False, False]
        assert cluster.workers[0].periodic_callbacks["memory_monitor"].callback_time == 500
    finally:
        cluster.close()
    again = take_local_cluster(settings)
    assert again is not first  # taken: the next run starts its own
    again.result(timeout=120).close()


def test_a_cluster_started_for_other_settings_is_closed_not_leaked():
    first = start_local_cluster(load_settings(n_workers=1))
    second = take_local_cluster(load_settings(n_workers=2))
    assert second is not first
    try:
        cluster = first.result(timeout=120)
        deadline = time.monotonic() + 60
        while cluster.status.name != "closed" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.status.name == "closed"
    finally:
        second.result(timeout=120).close()


@pytest.mark.parametrize("silenced", [True, False])
def test_teardown_silenced_before_distributed_is_imported_stays_silent(silenced):
    """An interrupt can come while the cluster's start-up thread still imports distributed, whose logging config
    then sets the teardown loggers' levels: the silence must outlast that import (a level did not; CI printed a
    nanny's failed start with its traceback). Unsilenced, the same records show: the check can fail."""
    script = textwrap.dedent(f"""
        import logging, sys
        import flows.boot
        assert "distributed" not in sys.modules
        if {silenced}:
            flows.boot.silence_cluster_teardown()
        import distributed  # noqa: F401 - its logging config is what this checks against
        for name in flows.boot.TEARDOWN_LOGGERS:
            logging.getLogger(name).error("teardown record from %s", name)
        logging.getLogger("distributed.scheduler").error("a scheduler error still shows")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a scheduler error still shows" in done.stderr
    assert ("teardown record" in done.stderr) is not silenced, done.stderr


def test_local_scheduler_is_quiet_after_an_interrupt_and_heard_before():
    """The local cluster's scheduler runs in the CLI: after a Ctrl-C it may report a gather of a result the
    stopped flow released (CI printed "Couldn't gather keys: {...: 'forgotten'}" under the run's one error line).
    Its records are dropped from the first interrupt on, and only then (flows.runners.early_local_cluster)."""
    script = textwrap.dedent("""
        import logging, os, signal, time
        import distributed  # noqa: F401 - its logging config gives the scheduler's logger a handler
        from flows.interrupts import terminate_as_interrupt, is_interrupt, quiet_after_interrupt
        from flows.runners import LOCAL_SCHEDULER_LOGGERS

        quiet_after_interrupt(*LOCAL_SCHEDULER_LOGGERS)
        scheduler = logging.getLogger("distributed.scheduler")
        with terminate_as_interrupt():
            scheduler.error("an error before the interrupt")
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt as exc:
                assert is_interrupt(exc)
            scheduler.error("Couldn't gather keys after the interrupt")
        logging.getLogger("distributed.worker").error("another logger still shows")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "an error before the interrupt" in done.stderr and "another logger still shows" in done.stderr
    assert "Couldn't gather keys" not in done.stderr, done.stderr


def test_nested_prefect_api_reuses_the_running_api_and_a_lost_api_stops_the_run(tmp_path):
    """The theory lab's audits nest prefect_api() inside its own: the inner block must reuse this process's
    temporary API, not stop it (it did, and the lab failed with ConnectError, then hung). And a run whose API
    dies is stopped at once with a message, not left retrying. The API's URL reaches the flow through Prefect's
    settings and the local workers through their environment; this process's environment is never changed."""
    code = textwrap.dedent("""
        import os, time, urllib.request
        from flows.boot import current_api, start_api, start_local_cluster
        from pipeline.settings import load_settings
        start_api()
        settings = load_settings(n_workers=1)
        start_local_cluster(settings)
        from distributed import Client
        from prefect import flow, task
        from prefect.settings import PREFECT_API_URL
        from flows.runners import early_local_cluster, prefect_api

        @task
        def one():
            return 1

        @flow
        def f(kill=False):
            if kill:
                current_api().process.kill()
                time.sleep(30)  # the watch interrupts this at once
            return one()

        with early_local_cluster(settings) as address, prefect_api() as outer:
            assert PREFECT_API_URL.value() == outer and "PREFECT_API_URL" not in os.environ
            with Client(address()) as client:
                client.wait_for_workers(1, timeout=240)
                assert set(client.run(lambda: os.environ.get("PREFECT_API_URL")).values()) == {outer}
        assert "PREFECT_API_URL" not in os.environ and PREFECT_API_URL.value() is None

        with prefect_api() as outer:
            with prefect_api() as inner:
                assert inner == outer and f() == 1
            with urllib.request.urlopen(outer + "/health", timeout=5) as r:
                assert r.status == 200  # still up after the nested block
            assert f() == 1
        started = time.monotonic()
        try:
            with prefect_api():
                f(kill=True)
        except RuntimeError as exc:
            print(f"{time.monotonic() - started:.1f}", exc)
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seconds, message = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert message.startswith("the temporary Prefect API (pid") and "exited with code -9 during the run" in message
    # each call the engine still makes to the lost API (the flow's crash report, a task's state) waits out 3 retries
    # (2 + 4 + 8 s) and gives up: 14-51 s measured, depending on where the kill lands; Prefect's default 5 retries
    # would make it ~62 s a call, minutes in all
    assert float(seconds) < 60
