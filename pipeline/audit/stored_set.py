"""A large probe set audited by name: planned from its stored files, its texts checked in blocks, never loaded whole.

A set stored under the root (by ``normaudit probes add`` or an audit of a probe file) was gated and hashed when it
was written, and an audit of it by name changes nothing of it: what is left to do before embedding is the
unknown-token check against the audited model's vocabulary, and the plan of shards still to embed, which
:func:`pipeline.audit.steps.plan_stored_set` makes in SQL over the files. This module does the check in blocks of
:data:`BLOCK_ROWS` items, so a scheduled audit of each new release of a model on a stored 10-million-item set holds
one block, not the set (which loaded whole took gigabytes in a worker's child process).
"""

from __future__ import annotations

import polars as pl
import pyarrow.parquet as pq

from pipeline.audit.context import AuditContext
from pipeline.audit.preflight import unknown_in_block, unknown_message
from pipeline.probes import brings_file
from pipeline.probes.base import ITEM_SCHEMA, ProbeInputError, ProbeSet
from pipeline.probes.builtin import BUILTIN
from pipeline.probes.stored import EXTERNAL
from pipeline.probes.templates import split_template
from pipeline.storage.plan import items_rows
from pipeline.storage.shards import read_rows

__all__ = ["BLOCK_ROWS", "planned_from_store", "unknown_in_stored"]

BLOCK_ROWS = 262_144  # items read and checked at a time (~30 MB of short sentences)


def planned_from_store(spec: str, size: int | None) -> bool:
    """Whether ``spec`` names a set stored under the root that is too large for the CLI's pre-flight (``size``:
    :func:`~pipeline.audit.preflight.checked_on_worker`'s answer for it): such a set is planned from its files (a
    built-in or external set is read from its source again: a new version of normaudit or of the data may change
    it; a stored set inside a template is made by applying the template)."""
    return (size is not None and not brings_file(spec) and split_template(spec) is None and spec not in BUILTIN
            and spec not in EXTERNAL)


def unknown_in_stored(ctx: AuditContext, name: str, limit: int | None = None) -> list[str]:
    """The unknown-token warning for the first ``limit`` items (None: all) of stored set ``name`` and the audited
    model, as a list of at most one message, read a block at a time; raises :class:`ProbeInputError` when every
    audited text is the unknown token (nothing would be learnt from embedding them)."""
    store = ctx.store
    rel = f"{store.probes_dir(name)}/items.parquet"
    total = items_rows(store, name)
    audited = total if limit is None else min(limit, total)
    count = 0
    first: list[str] = []
    token = None
    for start in range(0, audited, BLOCK_ROWS):
        size = min(BLOCK_ROWS, audited - start)

        def read(start=start, size=size):  # each block read on its own, under the store's retries (S3)
            with store.fs.open(store.path(rel), "rb") as fh:
                return read_rows(pq.ParquetFile(fh), start, size, list(ITEM_SCHEMA))

        items = pl.from_arrow(store.retry(read, f"read {rel}"))
        found = unknown_in_block(ctx.resolved, ProbeSet(name=name, items=items))
        if found is not None and found[0]:
            count, token = count + len(found[0]), found[1]
            first.extend(found[0][:6 - len(first)])
    if not count:
        return []
    message = unknown_message(name, first, count, audited, token, f"model {ctx.resolved.spec.name!r}")
    if count == audited:
        raise ProbeInputError(message)
    return [message]
