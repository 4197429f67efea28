"""Where tasks run and which Prefect API they report to: settings, not code."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from urllib.parse import urlparse

from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_CLIENT_MAX_RETRIES,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    temporary_settings,
)
from prefect_dask import DaskTaskRunner

from flows.boot import close_local_cluster, current_api, local_cluster_kwargs, start_api, stop_api, take_local_cluster
from flows.interrupts import interrupt_seen, quiet_after_interrupt, shielded
from pipeline.settings import Settings

# Longer than Dask's own bound on a worker's exit (a nanny kills a worker that has not exited 4 s after it was
# asked to close): a close cut short by this timeout would leave the cluster "closing", and distributed's exit
# handler would then wait up to 10 s for it. A worker's exit runs its exit handlers and takes a second or two
# (torch, transformers and Prefect are torn down module by module).
CLUSTER_CLOSE_TIMEOUT_S = 10.0
# After an interrupt the workers are ended at once (flows.boot.close_local_cluster): the CLI exits within seconds.
INTERRUPTED_CLOSE_TIMEOUT_S = 4.0
# The local cluster's scheduler runs in this process: after an interrupt it reports what the stopped flow left,
# such as a result the flow had asked for and then released ("Couldn't gather keys: {...: 'forgotten'}": the
# Ctrl-C cut the flow's wait short, and its gather reached the scheduler after the release).
LOCAL_SCHEDULER_LOGGERS = ("distributed.scheduler",)


def dask_runner(settings: Settings) -> DaskTaskRunner:
    """A Dask task runner: the scheduler at ``settings.dask_address``, else a local cluster of processes."""
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(settings))


@contextlib.contextmanager
def early_local_cluster(settings: Settings):
    """Yield a function returning the scheduler address of the local cluster, which starts now
    (or was started by the CLI, :mod:`flows.boot`) and is closed on exit.

    Its workers import torch and transformers while the caller does other start-up work
    (the Prefect API takes seconds to boot) and join when ready. With ``settings.dask_address`` set nothing is
    started and the function returns that address.
    """
    future = take_local_cluster(settings)
    if future is None:
        yield lambda: settings.dask_address
        return
    quiet_after_interrupt(*LOCAL_SCHEDULER_LOGGERS)
    try:
        yield lambda: future.result().scheduler_address
    finally:
        # Bounded: a worker still starting is waited for by Dask's close; after an interrupt the run has
        # recorded its end, and a worker left behind ends with this process (distributed's parent watch).
        with shielded("stopping: closing the local Dask workers (a few seconds at most)"):
            interrupted = interrupt_seen()
            close_local_cluster(future, INTERRUPTED_CLOSE_TIMEOUT_S if interrupted else CLUSTER_CLOSE_TIMEOUT_S,
                                interrupted=interrupted)


def _runner_has_gpus() -> bool:
    """Whether any worker of the current flow's Dask task runner declares a ``GPU`` resource."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    if not isinstance(runner, DaskTaskRunner):
        return False
    workers = runner.client.scheduler_info(n_workers=-1).get("workers", {}).values()  # starts the client
    return any(w.get("resources", {}).get("GPU", 0) > 0 for w in workers)


def workers_can_read(spec: str, settings: Settings) -> bool:
    """Whether the Dask workers can read probe set ``spec`` as this process does: anything but a local file, or a
    local file with the cluster on this machine (a scheduler on loopback, as the local cluster's is)."""
    from pipeline.probes import brings_file  # polars (seconds to import): only an audit's flow gets here

    if not brings_file(spec) or "://" in spec:
        return True
    host = urlparse(settings.dask_address or "tcp://127.0.0.1").hostname or ""
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def cluster_threads() -> int:
    """Threads of the current flow's Dask workers together (1 outside a Dask task runner)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    if not isinstance(runner, DaskTaskRunner):
        return 1
    return max(1, sum(runner.client.nthreads().values()))


class InFlightWindow:
    """How many shard tasks the flow keeps in flight: ``per_thread`` per worker thread of the cluster, looked up
    again every ``every_s`` seconds so workers that join later get work too.

    Two per thread: a worker finishing a shard finds the next one already queued on it, while the flow holds
    only a few futures (not one per shard of the audit).
    """

    def __init__(self, per_thread: int = 2, every_s: float = 10.0) -> None:
        self.per_thread, self.every_s = per_thread, every_s
        self._size, self._at = 0, float("-inf")

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self._at >= self.every_s:
            self._size, self._at = max(2, self.per_thread * cluster_threads()), now
        return self._size


@contextlib.contextmanager
def gpu_annotation():
    """Annotate tasks submitted inside to need one ``GPU`` resource when any worker declares GPUs.

    Workers started with ``--resources GPU=1`` then run one embedding task per GPU; on a
    cluster without GPU resources nothing is annotated (an annotation no worker can
    satisfy would leave the tasks waiting forever).
    """
    import dask

    if not _runner_has_gpus():
        yield False
        return
    with dask.annotate(resources={"GPU": 1}):
        yield True


@contextlib.contextmanager
def prefect_api(while_booting=None):
    """Make the flow process and every local Dask worker report to one Prefect API.

    With ``PREFECT_API_URL`` set (a running server, or a test harness) that API is used.
    Otherwise this process's temporary API (:mod:`flows.boot`, which the CLI starts before
    its imports) is used, instead of letting every worker process start its own (each
    start costs seconds and splits the run's records). ``while_booting`` is called while
    that API boots. The URL is set with Prefect's ``temporary_settings`` for this block only
    (the process environment is left as it was); Prefect sends these settings with every task
    it submits to a Dask worker, and local workers also get the URL in their environment
    (:func:`flows.boot.local_cluster_kwargs`).

    Re-entrant: a flow that runs another audit inside (the theory lab) reuses the enclosing
    block's API; only the outermost block watches it. If the temporary API exits while a
    run uses it, the run is stopped at once (as by Ctrl-C, so it records its end without the
    API) and this raises a ``RuntimeError`` that says so, instead of retrying for minutes.
    """
    url = PREFECT_API_URL.value()
    updates = {}
    api = current_api()
    nested = bool(url) and api is not None and url == api.url  # inside an enclosing prefect_api(): reuse it
    if url and not nested:
        stop_api()  # started by the CLI before a profile's PREFECT_API_URL could be read
        api = None
    elif not url:
        api = start_api()
        if api is None:  # PREFECT_API_URL was put in the environment after Prefect had read its settings
            url = os.environ["PREFECT_API_URL"]
    if while_booting:
        while_booting()
    if api is not None:
        # The server stops at interpreter exit, after Prefect has flushed its queued logs and
        # events to it; stopping it here would strand them.
        url = api.wait()
        # Heartbeats let a server notice a crashed flow run; this server dies with the run, and
        # each flow's exit waits up to a second for the heartbeat thread.
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
        # Three retries (back-off 2, 4, 8 s), not Prefect's five (a minute in all): its SQLite answers 503
        # when a write loses a race under load (a CI run failed after one retry), while a refused connection
        # means the server is gone; the watch below stops the run at once, and the engine's one crash
        # report then waits out 14 s of retries, not 62.
        updates[PREFECT_CLIENT_MAX_RETRIES] = 3
    watch = _ApiWatch(api) if api is not None and not nested else None
    try:
        with temporary_settings(updates={PREFECT_API_URL: url, **updates}):
            yield url
    except BaseException as exc:
        lost = api_lost()
        if lost and not nested:
            raise RuntimeError(
                f"{lost}, so the run stopped (it could no longer record its progress; {type(exc).__name__}). "
                "Committed shards are kept: rerun the command, or set PREFECT_API_URL to a running server "
                "(`prefect server start`)."
            ) from exc
        raise
    finally:
        if watch is not None:
            watch.stop()


def api_lost() -> str | None:
    """What happened to this process's temporary API if it exited while in use, else None."""
    api = current_api()
    if api is None or api.process.poll() is None or api.stopping:
        return None
    return f"the temporary Prefect API (pid {api.process.pid}) exited with code {api.process.returncode} during the run"


class _ApiWatch:
    """Interrupt the main thread when the temporary API exits under a run (it would otherwise wait on it)."""

    def __init__(self, api, poll_s: float = 0.5):
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(api, poll_s), name="normaudit-api-watch",
                                        daemon=True)
        self._thread.start()

    def _watch(self, api, poll_s: float) -> None:
        while not self._done.wait(poll_s):
            if api.process.poll() is not None and not api.stopping:
                print(f"error: {api_lost()}; stopping the run", file=sys.stderr, flush=True)
                # to the process: Linux delivers it to the main thread, which is where the run waits
                os.kill(os.getpid(), signal.SIGINT)
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
