"""The ``finetune`` flow: wiring only; fine-tune with checkpoints and a trace, then score the formula.

The training itself is one task (sentence-transformers' trainer in this process: a trainer is not split
across workers here); the formula is scored from the stored, gated ``training_trace``, not from memory.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.runners import prefect_api
from pipeline.settings import Settings, flow_settings
from pipeline.storage.runs import new_run_id
from pipeline.storage.store import open_store
from pipeline.theory import finetune as ft
from pipeline.theory import trace_formula

# cache_policy=NONE: settings and models are never hashed; no retries: training fails the same way twice
train_with_trace = task(ft.finetune, name="train_with_trace", cache_policy=NONE)
read_trace = task(trace_formula.read_trace, name="read_trace", cache_policy=NONE)
score_formula = task(trace_formula.score_formula, name="score_formula", cache_policy=NONE)


@flow(name="finetune")
def finetune(config: ft.FinetuneConfig, settings: Settings | None = None) -> dict:
    """Fine-tune ``config.model``; returns the run summary with the formula's out-of-sample scores."""
    log = get_run_logger()
    settings = flow_settings(settings)
    store = open_store(settings)
    store.check_writable()
    summary = train_with_trace(settings, store, config, new_run_id())
    log.info("%s: %d checkpoints in %s, %d trace rows", summary["run"], len(summary["checkpoints"]),
             summary["folder"], summary["trace_rows"])
    trace = read_trace(store, summary["run"])
    try:
        summary["formula"] = score_formula(trace, config.weight_decay)
    except ValueError as exc:  # a trace too short or subsampled: the run is still good, the formula unscored
        summary["formula"] = {"error": str(exc)}
    summary["root"] = settings.root
    return summary


def run_finetune(settings: Settings, config: ft.FinetuneConfig) -> dict:
    """Run :func:`finetune` in this process against one Prefect API (started here if needed)."""
    with prefect_api():
        return finetune(config=config, settings=settings)
