"""What the terminal shows: the progress, warnings and the summary by default, Prefect's per-task lines with
``--verbose``, no link to a server that is gone, and one ``error:`` line when an audit fails on bad data."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterTimestamp, TaskRunFilter, TaskRunFilterId
from prefect.settings import PREFECT_API_URL

from flows.console import FailureRecordsFilter

BIN = Path(sys.executable).parent


def _record(name: str, level: int, msg: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad shard")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord(name, level, __file__, 1, msg, None, exc_info)


def test_the_console_filter_drops_only_run_failure_records():
    keep = FailureRecordsFilter().filter
    assert not keep(_record("prefect.task_runs", logging.ERROR, "Task run failed with exception", exc=True))
    assert not keep(_record("prefect.flow_runs", logging.INFO, "Finished in state Failed('Flow run encountered')"))
    assert not keep(_record("prefect.flow_runs", logging.ERROR, "Crash detected! Execution was aborted"))
    assert keep(_record("prefect.flow_runs", logging.INFO, "Finished in state Completed()"))
    assert keep(_record("prefect.flow_runs", logging.WARNING, "abandoned run x: recorded as abandoned"))
    assert keep(_record("distributed.nanny", logging.ERROR, "worker process died", exc=True))  # not a run's
    # a run interrupted before its engine made the run's logger reports its crash through the engine's
    assert not keep(_record("prefect.engine", logging.ERROR, "Crash detected! Execution was aborted by an "
                                                             "interrupt signal."))
    assert keep(_record("prefect.engine", logging.ERROR, "Invalid flow entrypoint. Expected one argument"))


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_records_filtered_by_text_are_still_worded_so(prefect_api):
    """The two message-text filters of flows/console.py (written for TEXT_FILTERS_WRITTEN_FOR) match the records
    real flows log now: fails when Prefect words a failed final state or a crash otherwise."""
    from prefect import flow, task

    from flows.console import CRASH, FAILED_STATES, TEXT_FILTERS_WRITTEN_FOR

    @task
    def bad_shard():
        raise ValueError("bad shard")

    @flow
    def failing():
        bad_shard()

    @flow
    def interrupted():
        raise KeyboardInterrupt

    kept = _Kept()
    loggers = [logging.getLogger(n) for n in ("prefect.flow_runs", "prefect.task_runs", "prefect.engine")]
    for logger in loggers:
        logger.addHandler(kept)
    try:
        with pytest.raises(ValueError):
            failing()
        with pytest.raises(KeyboardInterrupt):
            interrupted()
    finally:
        for logger in loggers:
            logger.removeHandler(kept)
    said = [(r.name, r.levelno, r.getMessage()) for r in kept.records]
    version = f"the filter was written for {TEXT_FILTERS_WRITTEN_FOR}; Prefect logs now: {said}"
    final = [r for r in kept.records if r.name == "prefect.flow_runs" and r.getMessage().startswith(FAILED_STATES)]
    assert final and all(r.levelno == logging.INFO for r in final), version  # a level cannot tell them apart
    crash = [r for r in kept.records if r.getMessage().startswith(CRASH)]
    assert crash and all(r.levelno == logging.ERROR for r in crash), version
    keep = FailureRecordsFilter().filter
    for record in (*final, *crash):
        assert not keep(record)
        assert not keep(_record("prefect.engine", record.levelno, record.getMessage()))  # before the run's logger


def test_the_resource_trackers_leak_warning_is_silenced_by_category_and_module(tmp_path):
    """A process killed while it holds a semaphore makes multiprocessing's tracker warn at exit; the console's
    warnings filter (no text in it) drops that warning and only that."""
    from flows.console import QUIET_TRACKER_WARNING

    code = ("import multiprocessing as mp, os, signal; s = mp.get_context('spawn').Semaphore(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    loud = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "leaked semaphore" in loud.stderr, loud.stderr  # the warning the filter is for still comes
    quiet = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONWARNINGS": QUIET_TRACKER_WARNING},
                           capture_output=True, text=True, timeout=60)
    assert quiet.stderr == "", quiet.stderr


@pytest.fixture(scope="module")
def nan_model_and_probes(tmp_path_factory):
    """The tiny model with the input embedding row of 'apple' set to NaN, and items three of which contain it."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from tests.builders import build_tiny_model

    folder = tmp_path_factory.mktemp("nan")
    path = build_tiny_model(folder / "tiny-nan")
    token_id = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("apple")
    weights = load_file(path / "model.safetensors")
    weights["embeddings.word_embeddings.weight"][token_id] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    texts = ["dog", "cat", "tree", "river", "stone", "bread"] * 8
    texts[20:23] = ["apple dog", "apple cat", "apple tree"]
    probes = folder / "nanprobe.csv"
    pl.DataFrame({"item_id": [f"i{i:03d}" for i in range(48)], "text": texts,
                  "zipf": np.linspace(1, 7, 48)}).write_csv(probes)
    return path, probes


@pytest.mark.slow
def test_a_nan_weight_failure_prints_one_error_line_and_no_traceback(tmp_path, nan_model_and_probes):
    model, probes = nan_model_and_probes
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), NORMAUDIT_SHARD_SIZE="16")
    out = subprocess.run([str(BIN / "normaudit"), "audit", "--model", str(model), "--probes", str(probes),
                          "--root", str(tmp_path / "root"), "--release", "r1"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]
    console = out.stdout + out.stderr
    errors = [line for line in console.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, console[-4000:]  # the whole tail: a run that ended otherwise shows how
    assert "quarantined in" in errors[0] and "The GX result is next to the part" in errors[0]  # where to look
    assert "Traceback" not in console and "PartValidationError" not in console


# What the CLI sets for its run; a value in the test's own environment would be kept and change what is tested.
_CONSOLE_SETTINGS = ("PREFECT_API_URL", "PREFECT_UI_URL", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL",
                     "PREFECT_LOGGING_LEVEL", "DASK_DISTRIBUTED__DASHBOARD__LINK", "DASK_DISTRIBUTED__LOGGING")
_INFO_LINE = re.compile(r"\|\s*INFO\s*\|")
_WORDS = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "chair", "window"]


@pytest.fixture(scope="module")
def small_probes(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("console") / "words.csv"
    pl.DataFrame({"item_id": [f"i{i:03d}" for i in range(48)],
                  "text": [_WORDS[i % 12] + " " + _WORDS[(i * 5) % 12] for i in range(48)],
                  "zipf": np.linspace(1, 7, 48)}).write_csv(path)
    return path


def _audit(tmp_path: Path, model: Path, probes: Path, *extra: str, api_url: str | None = None):
    """The installed CLI on a root where a dead run is still marked running: the run logs a warning when it sweeps
    it."""
    root = tmp_path / "root"
    (root / "runs" / "running").mkdir(parents=True)
    dead = {"run_id": "old-run", "model": "m", "release": "r0", "host": socket.gethostname(), "pid": 2**22 - 1,
            "pid_started": 0.0, "started_at": 0.0}  # no such process: its run ended unrecorded
    (root / "runs" / "running" / "old-run.json").write_text(json.dumps(dead))
    env = {k: v for k, v in os.environ.items() if k not in _CONSOLE_SETTINGS}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), NORMAUDIT_SHARD_SIZE="16")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    out = subprocess.run([str(BIN / "normaudit"), "audit", "--model", str(model), "--probes", str(probes),
                          "--root", str(root), *extra], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def _assert_no_link_to_a_gone_server(console: str) -> None:
    assert "View at" not in console  # the temporary API has no UI and stops with the command
    assert "http://127.0.0.1" not in console and "http://localhost" not in console  # nor the local scheduler's


@pytest.mark.slow
def test_an_audit_prints_warnings_and_the_summary_but_no_info_lines(tmp_path, tiny_model_dir, small_probes):
    console = _audit(tmp_path, tiny_model_dir, small_probes)
    assert "words: embedded 48 items" in console and "query it: normaudit sql" in console
    warnings = [line for line in console.splitlines() if "WARNING" in line]
    assert any("abandoned run old-run" in line for line in warnings), console  # a warning still shows
    info = [line for line in console.splitlines() if _INFO_LINE.search(line)]
    assert info == [], info
    for noise in ("Finished in state", "great_expectations", "distributed.", "prefect.task_runner"):
        assert noise not in console, noise
    _assert_no_link_to_a_gone_server(console)


@pytest.mark.slow
def test_verbose_prints_the_per_task_lines_and_still_no_link_to_the_temporary_api(
        tmp_path, tiny_model_dir, small_probes):
    console = _audit(tmp_path, tiny_model_dir, small_probes, "--verbose")
    finished = [line for line in console.splitlines() if "Finished in state Completed()" in line]
    assert any("Task run 'register_run-" in line for line in finished), console  # a task of the CLI process
    assert any("Task run 'embed_shard-" in line for line in finished), console  # a task of a Dask worker process
    assert "abandoned run old-run" in console and "words: embedded 48 items" in console
    _assert_no_link_to_a_gone_server(console)


@pytest.mark.slow
def test_a_quiet_console_leaves_the_per_task_lines_in_the_prefect_run_logs(
        tmp_path, tiny_model_dir, small_probes, prefect_api):
    """Against a running API (the test harness's server, named by PREFECT_API_URL), read back with the client."""
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    console = _audit(tmp_path, tiny_model_dir, small_probes, api_url=PREFECT_API_URL.value())
    assert "Finished in state" not in console and not _INFO_LINE.search(console)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(timestamp=LogFilterTimestamp(after_=started)), limit=200)
        done = {log.task_run_id for log in logs
                if log.task_run_id is not None and log.message.startswith("Finished in state Completed()")}
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=list(done))))
    names = {run.name.rsplit("-", 1)[0] for run in runs}
    assert {"register_run", "open_release", "embed_shard", "render_report"} <= names, names
    assert any("abandoned run old-run" in log.message and log.level == logging.WARNING for log in logs)


def _steps(progress, seconds: float) -> None:
    from pipeline.progress import use_progress

    with use_progress(progress):
        progress.begin_steps("comparing m@v2 with m@v1", 3)
        for name in ("norm_vs_property of m@v1", "norm_vs_property of m@v2", "intervals"):
            progress.step(name)
            time.sleep(seconds / 3)
        progress.end_steps()


def test_a_transient_steps_bar_shows_only_once_the_work_runs_past_its_delay():
    """compare's bar (RichProgress(transient=True, delay_s=...)): drawn on a terminal once the work has run
    past the delay, naming the step under way; nothing for quick work, nothing in a file or pipe."""
    import io

    from rich.console import Console

    from pipeline.progress import RichProgress

    def drawn(seconds: float, delay_s: float, terminal: bool = True) -> str:
        out = io.StringIO()
        _steps(RichProgress(transient=True, delay_s=delay_s,
                            console=Console(file=out, force_terminal=terminal, width=120)), seconds)
        return out.getvalue()

    slow = drawn(1.5, 0.1)
    assert "comparing m@v2 with m@v1" in slow and "norm_vs_property of m@v2" in slow and "2/3" in slow
    assert drawn(0.0, 60.0) == ""  # ended long before its delay: never drawn
    assert drawn(1.5, 0.1, terminal=False) == ""  # no terminal: nothing, not even an empty line


@pytest.mark.slow
def test_compare_in_a_pipe_prints_its_tables_and_nothing_else(tmp_path):
    """Piped (no terminal), compare's stdout holds the comparison and no bar; stderr is empty: no library line."""
    from pipeline.audit.context import AuditContext
    from pipeline.audit.release_steps import run_analyses
    from pipeline.settings import load_settings
    from pipeline.storage.runs import RunRecord, write_run
    from pipeline.storage.store import Store
    from tests.helpers import store_synthetic, word_probe_set

    store, rng = Store(str(tmp_path / "root")), np.random.default_rng(0)
    props = {"zipf": rng.uniform(1, 7, 500), "min_depth": rng.integers(1, 12, 500).astype(float)}
    for day, release in ((1, "v1"), (2, "v2")):
        store_synthetic(store, "m", release, word_probe_set("nouns", 500, props), 1 + rng.normal(0, 0.1, 500))
        run = RunRecord(run_id=f"2024010{day}T000000-{release}", model="m", release=release,
                        fingerprint=str(day) * 64, probe_set="nouns", params={},
                        started_at=dt.datetime(2024, 1, day, tzinfo=dt.UTC))
        write_run(store, run)
        run_analyses(AuditContext(load_settings(root=store.root_url), "m", release, run.run_id, resolved=None))
        run.status = "completed"
        write_run(store, run)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run([str(BIN / "normaudit"), "compare", "--model", "m", "--release", "v2", "--root",
                          store.root_url], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr == ""
    assert out.stdout.startswith("norm_vs_property: m@v2 against m@v1") and "page: " in out.stdout
    assert "comparing m@v2" not in out.stdout and "━━━ " not in out.stdout
