"""Where tasks run and which Prefect API they report to: settings, not code."""

from __future__ import annotations

import contextlib
import logging
import os

from prefect_dask import DaskTaskRunner

from pipeline.settings import Settings


def dask_runner(settings: Settings) -> DaskTaskRunner:
    """A Dask task runner: the scheduler at ``settings.dask_address``, else a local cluster of processes."""
    if settings.dask_address:
        return DaskTaskRunner(address=settings.dask_address)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": settings.n_workers,
            # one task at a time per worker: torch already uses the worker's cores
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
            "silence_logs": logging.WARNING,
        },
    )


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
