"""Prefect tasks: each wraps one step of ``pipeline.audit.steps`` and carries its retry policy.

Retries where a retry can help (storage I/O); none where it cannot (bad input,
a model that fails validation). ``cache_policy=NONE``: results are committed to
storage by the steps themselves, and settings must never be hashed or recorded.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from pipeline.audit import steps
from pipeline.embedding.models import get_spec
from pipeline.embedding.models import resolve_model as _resolve_model
from pipeline.storage.runs import write_run


def _worth_retrying(task, task_run, state) -> bool:
    """Retry storage hiccups; never bad data, a held lease or a corrupt part (a retry cannot fix them)."""
    from pipeline.storage.lease import LeaseHeldError, LeaseLostError
    from pipeline.storage.store import CorruptPartError

    return not isinstance(state.data, (ValueError, LeaseHeldError, LeaseLostError, CorruptPartError))


STORAGE_RETRIES = {"retries": 3, "retry_delay_seconds": [1, 2, 4], "retry_condition_fn": _worth_retrying}


@task(cache_policy=NONE)
def resolve_model(name: str):
    """Resolve a model name, directory or hub id to local weights with their fingerprint."""
    return _resolve_model(get_spec(name))


@task(cache_policy=NONE)
def load_probes(settings, spec: str, run_id: str | None = None, replace: bool = False):
    """Load, validate and store one probe set."""
    return steps.load_and_store_probes(settings, spec, run_id, replace)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def register_run(settings, run):
    """Write the run's record (status running, then the final status)."""
    from pipeline.storage.store import open_store

    write_run(open_store(settings), run)
    return run.run_id


@task(cache_policy=NONE, **STORAGE_RETRIES)
def plan_shards(settings, ps, model: str, release: str, resolved, limit):
    """Split a probe set into shards and drop the committed ones."""
    return steps.plan_shards(settings, ps, model, release, resolved, limit)


@task(cache_policy=NONE, retries=1, retry_delay_seconds=2)
def embed_shard(settings, resolved, model: str, release: str, shard, run_id: str):
    """Embed one shard on a worker and stage its Parquet part."""
    return steps.embed_shard(settings, resolved, model, release, shard, run_id)


@task(cache_policy=NONE)
def validate_and_commit(settings, part, shard, template, run_id: str):
    """Validate a staged part, then commit it (manifest written last) or quarantine it."""
    return steps.validate_and_commit(settings, part, shard, template, run_id)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def compute_token_norms(settings, resolved, model: str, release: str):
    """Compute the norms of the model's input token-embedding table on a worker (None if stored)."""
    return steps.compute_token_norms(settings, resolved, model, release)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def commit_token_norms(settings, computed, model: str, release: str, run_id: str | None = None):
    """Validate the token norms and store them, once per release."""
    return steps.commit_token_norms(settings, computed, model, release, run_id)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def open_release(settings, model: str, release: str, run_id: str):
    """Take the release's lease: one audit of a model release at a time."""
    from pipeline.quality.gates import open_release as _open
    from pipeline.storage.store import open_store

    return _open(open_store(settings), model, release, run_id)


@task(cache_policy=NONE)
def close_release(settings, model: str, release: str, run_id: str, data_docs: bool = True):
    """Release the lease and build the run's Data Docs next to the data (unless ``data_docs`` is False)."""
    from pipeline.quality.gates import close_release as _close
    from pipeline.storage.store import open_store

    return _close(open_store(settings), model, release, run_id, data_docs)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def run_analyses(settings, model: str, release: str, run_id: str):
    """Run the SQL analyses over committed data and store the results."""
    return steps.run_analyses(settings, model, release, run_id)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def compare_with_previous(settings, model: str, release: str, run_id: str, thresholds):
    """Compare a run's statistics with the previous release of the model and store the alerts."""
    return steps.compare_with_previous(settings, model, release, run_id, thresholds)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def find_new_releases(settings, watched):
    """List the releases of a watched model that have not been audited yet."""
    return steps.find_new_releases(settings, watched)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def clean_staging(settings, run_id: str):
    """Remove the run's staging folder: empty once every shard is committed, useless once the run ended."""
    from pipeline.storage.store import open_store

    open_store(settings).rm(f"staging/{run_id}", recursive=True)


@task(cache_policy=NONE, **STORAGE_RETRIES)
def sweep_abandoned_runs(settings):
    """Record runs whose process is gone as ``abandoned`` and remove the staging no live run owns."""
    from pipeline.storage.runs import find_abandoned, sweep_abandoned
    from pipeline.storage.store import open_store

    store = open_store(settings)
    found = find_abandoned(store)
    sweep_abandoned(store, found)
    return [r.describe() for r in found]


@task(cache_policy=NONE, **STORAGE_RETRIES)
def render_report(settings, model: str, release: str):
    """Render the release's HTML report (plots beside it) and the model's cross-release index."""
    return steps.render_report(settings, model, release)
