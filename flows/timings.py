"""Where a run's time went, read from what Prefect recorded: its task runs and its subflows' task runs.

Prefect records every task run's start, end and time spent running; nothing here measures. A task run
reaches the API as events (from the flow process and from each Dask worker), so the last ones may land
a moment after the flow returns: :func:`recorded_timings` reads until every run it sees has ended and
their number holds still, for at most ``settle_s`` seconds.
"""

from __future__ import annotations

import time
from typing import NamedTuple
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId

PAGE = 200  # the API's default page size
# the tasks that load, check, store and plan probe sets; their wall span is reported apart
PREPARATION_TASKS = frozenset({"prepare_probes", "split_probe_file", "prepare_block", "assemble_probe_set",
                               "plan_stored_set"})
PREPARATION = "probe preparation wall"


class Timing(NamedTuple):
    """How many runs a step had and the seconds they spent running, summed (parallel runs add up)."""

    runs: int
    seconds: float


def recorded_timings(flow_run_id: UUID | str, settle_s: float = 5.0) -> dict[str, Timing]:
    """Seconds per task name for the flow run and its subflows, after the flow run's own (key ``flow NAME``).

    A subflow appears under its flow's name (Prefect records it as a task run of its parent). Tasks come
    in order of first start. Reads only; needs the run's API.
    """
    with get_client(sync_client=True) as client:
        flow = client.read_flow_run(UUID(str(flow_run_id)))
        flow_name = client.read_flow(flow.flow_id).name
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow.id])))
        ids = [flow.id, *(f.id for f in subflows)]
        deadline, seen = time.monotonic() + settle_s, -1
        while True:
            runs = _task_runs(client, ids)
            if (seen == len(runs) and all(r.end_time for r in runs)) or time.monotonic() > deadline:
                break
            seen = len(runs)
            time.sleep(0.1)
    out = {f"flow {flow_name}": Timing(1, flow.total_run_time.total_seconds())}
    spans = [r for r in runs if r.name.rsplit("-", 1)[0] in PREPARATION_TASKS and r.start_time and r.end_time]
    if spans:  # parallel tasks: their wall time is not their sum
        out[PREPARATION] = Timing(len(spans), (max(r.end_time for r in spans) -
                                               min(r.start_time for r in spans)).total_seconds())
    for r in sorted(runs, key=lambda r: (r.start_time is None, r.start_time or 0)):
        # Prefect names a task run "<task name>-<suffix>" (a subflow's: "<flow name>-<n>")
        name = r.name.rsplit("-", 1)[0]
        runs_so_far, seconds = out.get(name, Timing(0, 0.0))
        out[name] = Timing(runs_so_far + 1, seconds + r.total_run_time.total_seconds())
    return out


def _task_runs(client, flow_run_ids: list[UUID]) -> list:
    found, offset = [], 0
    while True:
        page = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids)),
                                     limit=PAGE, offset=offset)
        found.extend(page)
        if len(page) < PAGE:
            return found
        offset += PAGE
