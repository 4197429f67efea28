"""`normaudit theory run` as a user runs it: the installed CLI, no PREFECT_API_URL, no test harness."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_theory_run_without_an_api_url_audits_its_checkpoints_and_exits_0(tmp_path):
    """The nested checkpoint audits once stopped the lab's own temporary API: ConnectError, then a hang."""
    config = tmp_path / "small.yaml"
    config.write_text(
        "name: cli\nworld: {depth: 2, branching: 3, items_per_concept: 3}\n"
        "train: {steps: 100, batch_size: 16, weight_decay: 0.01}\nidentity: {steps: 5}\n"
        "sweep: {lrs: [1.0], batch_sizes: [16], weight_decays: [0.01]}\ncheckpoints: {count: 2}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    root = tmp_path / "root"
    out = subprocess.run([str(BIN / "normaudit"), "theory", "run", "--config", str(config), "--root", str(root)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "ConnectError" not in out.stderr
    assert "Future exception was never retrieved" not in out.stderr
    # the bar's last states (runs of the sweep, then audited checkpoints) and nothing from the libraries
    # every point of the sweep (its one cell for each model kind) trained: the count's done equals its total
    assert re.search(r"theory lab theory-cli-\w+ .* (\d+)/\1 runs .*left", out.stdout), out.stdout
    assert re.search(r"auditing theory-cli-\w+ .* 2/2 checkpoints .*left", out.stdout), out.stdout
    for chatter in ("Loading weights", "Writing model shards", "it/s", "INFO"):
        assert chatter not in out.stdout + out.stderr, chatter
    (folder,) = (root / "theory").iterdir()
    checkpoints = pl.read_parquet(folder / "checkpoints.parquet")
    assert sorted(set(checkpoints["release"])) == ["step-000000", "step-000100"]
    runs = pl.read_parquet(list((root / "runs").glob("*.parquet")))
    assert sorted(runs["status"].to_list()) == ["completed", "completed"]
