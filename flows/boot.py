"""Start the slow services of a local run first: the Prefect API and the local Dask cluster.

**The API.** A temporary Prefect API for one CLI run, started before Prefect is even imported.

It is ``prefect server start`` (Prefect's documented command) in a child process on a free
loopback port, configured through Prefect's public settings: no UI, no telemetry, and only
the server services a run needs (the task run recorder; no scheduler, late-run, automation
or event-storage services). The caller imports flows, Great Expectations and the rest while
it boots. Its database is Prefect's own (``PREFECT_HOME``), as with Prefect's temporary
server: the runs stay listed there afterwards. For repeated local use, start one server with
``prefect server start`` and set ``PREFECT_API_URL``: then nothing is started here.

**The cluster.** The local cluster's scheduler starts on a background thread at once; its
worker processes join when they have imported torch and transformers, and tasks queue on
the scheduler until then, so neither the API nor the flow waits for them.

Importing this module imports nothing heavy. Nothing here runs when ``PREFECT_API_URL``
points at a running server or ``dask_address`` at a running scheduler.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from threading import Thread

import psutil

_STARTUP_TIMEOUT_S = 120.0
# Long enough for a worker to start (imports) or be restarted by its nanny on a slow machine.
NO_WORKERS_TIMEOUT = "120s"


# Prefect's public settings (environment variables) of the temporary server.
SERVER_SETTINGS = {
    "PREFECT_SERVER_UI_ENABLED": "false",  # nobody can open it: it is gone when the command ends
    # no telemetry: this machine may have no route out, and the server would log errors
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Runs, task runs, states and logs are recorded as ever (the task run recorder stays on); the raw
    # event stream is not stored: nothing reads it once a temporary API is gone, and its SQLite writes
    # held up the run's own API calls by up to 2 s (a subflow's creation, measured).
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
    # Services for deployments, schedules, work pools and automations, which a CLI run has none of (Prefect's
    # own temporary server does not run them either): each would poll the database while the run writes to it.
    **{f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
        "SCHEDULER", "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
        "CLEANUP_RECONCILER", "TRIGGERS")},
    "PREFECT_SERVER_LOGGING_LEVEL": "ERROR",  # its warnings are not the run's; errors go to its error file
    "PREFECT_CLI_PROMPT": "false",  # `prefect server start` may otherwise offer to edit the user's profiles
}


class TemporaryAPI:
    """One ``prefect server start`` process on a free loopback port; stopped at interpreter exit."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (open as long as the server runs)
        self.process = subprocess.Popen(
            # under flows.parent_watch: the server stops when this process is gone, even after a SIGKILL
            [sys.executable, "-m", "flows.parent_watch", str(os.getpid()),
             "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env={**os.environ, **SERVER_SETTINGS},
            # its banner ("Configure Prefect to communicate with the server ...") is not for this run's user
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            # Its errors go to a file, not the run's console: a Ctrl-C drops the run's open requests, and the
            # server logs each dropped database session with a traceback (a CI run caught one). The file's
            # tail is shown if the server fails to start.
            stderr=self._errors,
            # Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) must not stop the
            # API under the run, which still records its end there; this process stops it afterwards.
            process_group=0,
        )
        # Registered before Prefect registers its own exit handlers, so it runs after them
        # (atexit is last-in first-out): queued logs and events reach the server first.
        atexit.register(self.stop)
        self._ready = False
        self.stopping = False  # set by stop(): its exit from then on is expected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait(self, timeout: float = _STARTUP_TIMEOUT_S) -> str:
        """Block until the API answers its health check; return its URL."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the temporary Prefect API exited with code {self.process.returncode} before it was ready; "
                    "run `prefect server start` to see why, or set PREFECT_API_URL to a running server."
                    f"{self.error_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    self._ready = response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the temporary Prefect API did not answer within {timeout:.0f} s; "
                        "set PREFECT_API_URL to a running server."
                    ) from None
                time.sleep(0.05)
        return self.url

    def error_tail(self, size: int = 2000) -> str:
        """The end of what the server wrote to stderr, as a paragraph to append to a message ('' if none)."""
        self._errors.seek(0, os.SEEK_END)
        self._errors.seek(max(0, self._errors.tell() - size))
        tail = self._errors.read().decode(errors="replace").strip()
        return f"\nIts last output:\n{tail}" if tail else ""

    def stop(self) -> None:
        self.stopping = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_api: TemporaryAPI | None = None


def start_api() -> TemporaryAPI | None:
    """Start this process's temporary API unless ``PREFECT_API_URL`` is set; idempotent, returns at once."""
    global _api
    if os.environ.get("PREFECT_API_URL"):
        return None
    if _api is None or _api.process.poll() is not None:
        _api = TemporaryAPI()
    return _api


def stop_api() -> None:
    """Stop this process's temporary API, if one was started."""
    global _api
    if _api is not None:
        _api.stop()
        _api = None


def current_api() -> TemporaryAPI | None:
    """This process's temporary API, if one was started and not stopped."""
    return _api


# Dask's periodic callbacks, slower than its defaults (documented config keys). The local scheduler and the nannies
# run in the CLI's process, the one every audit passes through: at the defaults (a 20 ms event-loop tick, a system
# monitor every 0.5 s reading the host's disk counters, a memory check per nanny every 0.1 s, work stealing every
# 0.1 s) the cluster's event loop cost that process 5.2% of a core while two workers computed, 0.85% at these (40 s
# each, benchmarks/idle_cluster.py): time the flow spends waiting on the shards. The tick only measures how long the
# loop was blocked (Dask warns past 3 s whatever the interval); there is no dashboard to feed the system monitor; a
# worker past its memory limit is stopped within half a second instead of a tenth; with a few shards in flight per
# thread there is little to steal.
QUIET_CLOCKS = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "10s",
    "distributed.admin.system-monitor.disk": False,
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.scheduler.work-stealing-interval": "500ms",
}


def local_cluster_kwargs(settings, api_url: str | None = None) -> dict:
    """Keyword arguments of the default local cluster of worker processes.

    With ``api_url``, every worker process gets it as ``PREFECT_API_URL`` (the nannies' ``env``):
    whatever Prefect does in a worker outside a task run (tasks carry the flow's settings) reports
    to the run's API, never to a temporary server of the worker's own.
    """
    kwargs = {
        "n_workers": settings.n_workers,
        # one task at a time per worker: torch already uses the worker's cores
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": None,  # no dashboard, and none of its modules imported
        # the scheduler's plain HTTP routes (health, metrics) on a free loopback port: two clusters of one
        # machine never contend for 8787
        "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
        "silence_logs": logging.WARNING,
        # no statistical profiler: it samples every worker thread each 10 ms, CPU taken from torch for a profile
        # nothing reads (no dashboard). A dotted key: the nanny merges this into its config one level deep only.
        "config": {"distributed.worker.profile.enabled": False, **QUIET_CLOCKS},
        # local_worker first: it makes the worker ignore Ctrl-C before warmup spends seconds importing torch
        "preload": ["flows.local_worker", "pipeline.embedding.warmup"],
    }
    if api_url:
        kwargs["env"] = {"PREFECT_API_URL": api_url}
    return kwargs


_cluster: tuple[dict, Future] | None = None


def start_local_cluster(settings) -> Future | None:
    """Start the local cluster on a background thread unless ``settings.dask_address`` is set.

    Returns a future of the ``LocalCluster``; a later call with the same settings returns the
    same future until :func:`take_local_cluster` hands it to its owner.
    """
    global _cluster
    if settings.dask_address:
        return None
    kwargs = local_cluster_kwargs(settings, api_url=_api.url if _api is not None else None)
    if _cluster is not None and _cluster[0] != kwargs:  # started for other settings and never taken
        _cluster[1].add_done_callback(_close_cluster)
        _cluster = None
    if _cluster is None:
        future: Future = Future()

        def run():
            # Ctrl-C is the CLI's to handle, never its workers': a signal mask is inherited by the threads this
            # thread starts (the cluster's event loop, the nannies' process threads) and by the worker processes
            # they spawn, across exec, so a local worker holds SIGINT blocked from its first instruction, before
            # Python, Dask or torch run (a worker that died of a group Ctrl-C while starting would print a
            # traceback and be restarted by its nanny). multiprocessing's resource tracker unblocks SIGINT in the
            # thread that starts it, so it is started first (by a spawn lock). SIGTERM stays open: it is how a
            # nanny stops its worker.
            multiprocessing.get_context("spawn").Lock()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                import dask
                from distributed import LocalCluster

                # The scheduler first, then workers in the background: a flow can start (and queue
                # its first tasks) while the workers still import torch. Tasks that no worker can take
                # for NO_WORKERS_TIMEOUT fail (Dask's own setting, unless the user set it): a lost
                # worker that never comes back ends the audit with an error instead of a wait forever.
                timeout = dask.config.get("distributed.scheduler.no-workers-timeout") or NO_WORKERS_TIMEOUT
                # The clocks are set for this process, not for a block: each nanny reads them when it is built, on
                # the cluster's event loop after scale() has returned (a block closed by then left the nannies at
                # Dask's defaults), and again whenever Dask builds one.
                dask.config.set(QUIET_CLOCKS)
                with dask.config.set({"distributed.scheduler.no-workers-timeout": timeout}):
                    cluster = LocalCluster(**{**kwargs, "n_workers": 0})
                cluster.scale(kwargs["n_workers"])
                future.set_result(cluster)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

        Thread(target=run, name="normaudit-local-cluster", daemon=True).start()
        _cluster = (kwargs, future)
    return _cluster[1]


def _close_cluster(future: Future) -> None:
    if future.exception() is None:
        future.result().close()


def end_local_workers(grace_s: float = 0.5) -> int:
    """End this process's local Dask worker processes at once; return how many there were.

    Only this process's own children started by multiprocessing's spawn (the nannies' workers) are
    ended: the temporary API is not one of them, and nothing committed lives in a worker. A worker
    runs no SIGTERM handler, so it ends at once, mid-import or mid-shard.
    """
    workers = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "multiprocessing.spawn" in " ".join(child.cmdline()):
                workers.append(child)
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            worker.terminate()
    _, alive = psutil.wait_procs(workers, timeout=grace_s)
    for worker in alive:
        with contextlib.suppress(psutil.Error):
            worker.kill()
    return len(workers)


# Loggers through which a nanny whose worker was ended reports its failed start, with a traceback.
TEARDOWN_LOGGERS = ("tornado.application", "distributed.nanny", "distributed.deploy.spec")


class _DropAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # noqa: ARG002 - the logging.Filter protocol
        return False


def silence_cluster_teardown() -> None:
    """Keep the local cluster's teardown after an interrupt off the terminal: expected, and noise under the
    run's one error line.

    A filter, not a level: importing ``distributed`` sets these loggers' levels from its logging config, and
    the cluster's start-up thread may still be importing it when an early interrupt comes (CI once saw
    "Nanny failed to start" with its traceback after a Ctrl-C during the pre-flight).
    """
    for name in TEARDOWN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropAll) for f in logger.filters):
            logger.addFilter(_DropAll())


def close_local_cluster(future: Future, timeout: float, interrupted: bool = False) -> None:
    """Close a local cluster, waiting up to ``timeout`` for it; after an interrupt, without waiting for workers.

    A nanny that is still starting its worker (the worker imports torch for seconds) makes
    ``LocalCluster.close`` wait for that start, and a close cut short by its timeout leaves the
    cluster "closing", which distributed's exit handler then waits 10 s for. After an interrupt
    the close runs uncut on a helper thread while this one ends every worker process of this
    process (a nanny may spawn one after the first sweep): a nanny whose worker is gone fails its
    start at once, and the close completes in about a second.
    """
    def close() -> None:
        with contextlib.suppress(Exception):  # the run has recorded its end: a failing close is no news
            future.result(timeout=timeout).close(timeout=None if interrupted else timeout)

    if not interrupted:
        close()
        return
    silence_cluster_teardown()
    closer = Thread(target=close, name="normaudit-close-cluster", daemon=True)
    closer.start()
    deadline = time.monotonic() + timeout
    while closer.is_alive() and time.monotonic() < deadline:
        end_local_workers(grace_s=0.2)
        closer.join(0.1)
    end_local_workers(grace_s=0.2)


def stop_after_interrupt(timeout: float = 3.0) -> None:
    """After an interrupt that came before a run took the local cluster: close it and its workers now.

    Left to distributed's exit handler, a cluster whose workers are still starting holds the exit for 10 s.
    """
    global _cluster
    if _cluster is not None:
        future, _cluster = _cluster[1], None
        close_local_cluster(future, timeout, interrupted=True)


def take_local_cluster(settings) -> Future | None:
    """The started (or now starting) local cluster's future; the caller owns and closes the cluster."""
    global _cluster
    future = start_local_cluster(settings)
    _cluster = None
    return future
