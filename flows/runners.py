"""Where tasks run and which Prefect API they report to: settings, not code."""

from __future__ import annotations

import contextlib
import logging
import os

from prefect_dask import DaskTaskRunner

from pipeline.settings import Settings


def local_cluster_kwargs(settings: Settings) -> dict:
    """Keyword arguments of the default local cluster of worker processes."""
    return {
        "n_workers": settings.n_workers,
        # one task at a time per worker: torch already uses the worker's cores
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": None,
        "silence_logs": logging.WARNING,
        "preload": ["pipeline.warmup"],
    }


def dask_runner(settings: Settings) -> DaskTaskRunner:
    """A Dask task runner: the scheduler at ``settings.dask_address``, else a local cluster of processes."""
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(settings))


@contextlib.contextmanager
def early_local_cluster(settings: Settings):
    """Start the local cluster in the background now; yield a function returning its address.

    Its workers import torch and transformers while the caller does other start-up work
    (the Prefect API takes seconds to boot). With ``settings.dask_address`` set nothing is
    started and the function returns that address.
    """
    if settings.dask_address:
        yield lambda: settings.dask_address
        return
    from concurrent.futures import ThreadPoolExecutor

    from distributed import LocalCluster

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(LocalCluster, **local_cluster_kwargs(settings))
    try:
        yield lambda: future.result().scheduler_address
    finally:
        with contextlib.suppress(Exception):
            future.result().close()
        pool.shutdown()


@contextlib.contextmanager
def gpu_annotation():
    """Annotate tasks submitted inside to need one ``GPU`` resource when any worker declares GPUs.

    Workers started with ``--resources GPU=1`` then run one embedding task per GPU; on a
    cluster without GPU resources nothing is annotated (an annotation no worker can
    satisfy would leave the tasks waiting forever).
    """
    import dask
    from prefect_dask import get_dask_client

    try:
        with get_dask_client() as client:
            workers = client.scheduler_info().get("workers", {}).values()
            has_gpu = any(w.get("resources", {}).get("GPU", 0) > 0 for w in workers)
    except (RuntimeError, ValueError, AttributeError):  # not on a (started) Dask task runner
        has_gpu = False
    if not has_gpu:
        yield False
        return
    with dask.annotate(resources={"GPU": 1}):
        yield True


@contextlib.contextmanager
def prefect_api():
    """Make the flow process and every local Dask worker report to one Prefect API.

    With ``PREFECT_API_URL`` set (a running server, or a test harness) that API is used.
    Otherwise one temporary API is started here, instead of letting every worker
    process start its own (each start costs seconds and splits the run's records).
    Worker processes inherit the URL through their environment.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings

    url = PREFECT_API_URL.value()
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        # No telemetry: this machine may have no route out, and the server would log errors.
        with temporary_settings(updates={PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            server = SubprocessASGIServer()
            server.start()
        # The server stops at interpreter exit (Prefect registers that), after Prefect has
        # flushed its queued logs and events to it; stopping it here would strand them.
        url = server.api_url
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
