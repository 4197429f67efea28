"""What the local Dask cluster costs the CLI's process while its workers compute.

Run:  python benchmarks/idle_cluster.py [--workers 2] [--seconds 40]

The local cluster's scheduler and nannies live in the CLI's process, the one every audit passes through, and
their periodic callbacks (event-loop tick, system monitor, memory monitor, work stealing) cost it CPU for as long
as the audit runs, whatever the items. This script starts, one after the other in this process, (1) a local
cluster as Dask's defaults make it (``LocalCluster`` with the audit's keyword arguments less the config) and (2)
the audit's own local cluster (``flows.boot.start_local_cluster``, with ``QUIET_CLOCKS``), keeps every worker busy
with a numpy loop for ``--seconds`` and prints this process's CPU-seconds over that window for each, and the ratio.
It also prints the tick interval each nanny runs at (read from the nanny object), so a setting that did not reach
the nannies shows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def spin(seconds: float) -> float:
    """Keep a worker's thread busy with numpy for ``seconds``."""
    import numpy as np

    t, x = time.monotonic(), 0.0
    while time.monotonic() - t < seconds:
        a = np.random.default_rng().random((200, 200))
        x += float((a @ a).sum())
    return x


def measure(cluster, seconds: float, n_workers: int) -> tuple[float, list[float]]:
    """CPU-seconds of this process while ``n_workers`` workers spin; the nannies' tick intervals (ms)."""
    from distributed import Client

    with Client(cluster.scheduler_address) as client:
        client.wait_for_workers(n_workers, timeout=300)
        futures = [client.submit(spin, seconds + 5, pure=False) for _ in range(n_workers)]
        time.sleep(3)  # the tasks started
        before = psutil.Process().cpu_times()
        time.sleep(seconds)
        after = psutil.Process().cpu_times()
        client.gather(futures)  # a running task cannot be cancelled: the workers close once it ends
    ticks = [w.periodic_callbacks["tick"].callback_time for w in cluster.workers.values()]
    return (after.user + after.system) - (before.user + before.system), ticks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=40.0)
    args = ap.parse_args()

    from distributed import LocalCluster

    from flows.boot import close_local_cluster, local_cluster_kwargs, take_local_cluster
    from pipeline.settings import Settings

    settings = Settings(n_workers=args.workers)
    plain_kwargs = {k: v for k, v in local_cluster_kwargs(settings).items() if k != "config"}
    plain_kwargs["preload"] = ["flows.local_worker"]  # no torch import: the start is not what is measured
    with LocalCluster(**plain_kwargs) as cluster:
        plain, plain_ticks = measure(cluster, args.seconds, args.workers)
    future = take_local_cluster(settings)
    try:
        quiet, quiet_ticks = measure(future.result(), args.seconds, args.workers)
    finally:
        close_local_cluster(future, 10.0)
    print(f"{args.workers} busy workers, {args.seconds:.0f} s each; CPU-seconds of this process (scheduler + nannies)")
    print(f"  Dask's defaults:            {plain:.2f} CPU-s = {100 * plain / args.seconds:.2f}% of a core; "
          f"nanny ticks {plain_ticks} ms")
    print(f"  the audit's local cluster:  {quiet:.2f} CPU-s = {100 * quiet / args.seconds:.2f}% of a core; "
          f"nanny ticks {quiet_ticks} ms")
    print(f"  ratio audit's / defaults: {quiet / plain:.2f}")


if __name__ == "__main__":
    main()
