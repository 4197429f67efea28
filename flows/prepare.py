"""A large probe file prepared on every worker at once: the flow only wires the steps of
:mod:`pipeline.audit.prepare` (split, one task per block, assemble and plan) and holds a few numbers per block."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE
from prefect.futures import wait

from pipeline.audit import prepare, steps
from pipeline.audit.context import AuditContext
from pipeline.probes import file_set_name


def _task(fn):
    # as flows/audit.py's steps: nothing cached, nothing hashed (the settings hold credentials)
    return task(fn, name=fn.__name__, cache_policy=NONE)


split_probe_file = _task(prepare.split_probe_file)
prepare_block = _task(prepare.prepare_block)
assemble_probe_set = _task(prepare.assemble_probe_set)
plan_stored_set = _task(steps.plan_stored_set)
drop_staging = _task(prepare.drop_staging)


def prepare_in_blocks(ctx: AuditContext, spec: str, limit: int | None, replace: bool) -> steps.ProbePlan:
    """Split ``spec``, prepare its blocks in parallel, store the set and plan its shards; the first bad block in
    the file's order raises its error (nothing is stored then; the blocks are swept by a later run)."""
    name = file_set_name(spec)
    blocks = split_probe_file.submit(ctx, spec, name).result()
    futures = [prepare_block.submit(ctx, name, block, limit) for block in blocks]
    try:
        prepared = [f.result() for f in futures]
        assembled = assemble_probe_set.submit(ctx, spec, name, prepared, replace, limit).result()
    except Exception:
        wait(futures)  # the other blocks end first: none may write into the folder after it is removed
        drop_staging(ctx, name)
        raise
    plan = plan_stored_set.submit(ctx, name, {}, limit).result()
    plan.warnings[:0] = assembled.warnings
    return plan
