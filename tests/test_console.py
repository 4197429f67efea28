"""What the terminal shows when an audit fails on bad data: one ``error:`` line that says where the details are."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

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
    assert len(errors) == 1, errors
    assert "quarantined in" in errors[0] and "The GX result is next to the part" in errors[0]  # where to look
    assert "Traceback" not in console and "PartValidationError" not in console
