"""Where tasks run and which Prefect API they report to: settings, not code."""

from __future__ import annotations

import contextlib
import os

from prefect_dask import DaskTaskRunner

from flows.boot import local_cluster_kwargs, take_local_cluster
from flows.interrupts import shielded
from pipeline.settings import Settings

CLUSTER_CLOSE_TIMEOUT_S = 4.0


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
    try:
        yield lambda: future.result().scheduler_address
    finally:
        # Bounded: a worker still starting is waited for by Dask's close; after an interrupt the run has
        # recorded its end, and a worker left behind ends with this process (distributed's parent watch).
        with shielded("stopping: closing the local Dask workers (a few seconds at most)"), \
                contextlib.suppress(Exception):
            future.result(timeout=CLUSTER_CLOSE_TIMEOUT_S).close(timeout=CLUSTER_CLOSE_TIMEOUT_S)


def _runner_has_gpus() -> bool:
    """Whether any worker of the current flow's Dask task runner declares a ``GPU`` resource."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    if not isinstance(runner, DaskTaskRunner):
        return False
    workers = runner.client.scheduler_info(n_workers=-1).get("workers", {}).values()  # starts the client
    return any(w.get("resources", {}).get("GPU", 0) > 0 for w in workers)


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
    that API boots. Worker processes inherit the URL through their environment.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.boot import current_api, start_api, stop_api

    url = PREFECT_API_URL.value()
    updates = {}
    api = current_api()
    if url and (api is None or url != api.url):
        stop_api()  # started by the CLI before a profile's PREFECT_API_URL could be read
        api = None
    elif url:
        url = None  # this process's own temporary API, set by an enclosing prefect_api(): use it, never stop it
    else:
        api = start_api()
    if while_booting:
        while_booting()
    if api is not None:
        # The server stops at interpreter exit, after Prefect has flushed its queued logs and
        # events to it; stopping it here would strand them.
        url = api.wait()
        # Heartbeats let a server notice a crashed flow run; this server dies with the run, and
        # each flow's exit waits up to a second for the heartbeat thread.
        updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
    previous = os.environ.get("PREFECT_API_URL")
    url = url or previous  # set in the environment after Prefect read its settings: start_api defers to it
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url, **updates}):
            yield url
    except Exception as exc:
        if api is not None and api.process.poll() is not None:
            raise RuntimeError(
                f"the temporary Prefect API (pid {api.process.pid}) exited with code {api.process.returncode} "
                f"during the run, so the run could not record its progress ({type(exc).__name__}). Committed "
                "shards are kept: rerun the command, or set PREFECT_API_URL to a running server "
                "(`prefect server start`)."
            ) from exc
        raise
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
