"""Task runners: where tasks run is a setting, not code (local processes or an external scheduler)."""

from __future__ import annotations

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
        },
    )
