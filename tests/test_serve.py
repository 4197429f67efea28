"""Scheduled release audits: serve a deployment over a checkpoint folder, add a checkpoint, trigger, compare."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipeline.analysis.compare import AlertThresholds
from pipeline.audit.watch import AuditsConfig, checkpoint_dirs, load_audits_config
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store
from tests.builders import build_tiny_model

pytestmark = pytest.mark.slow


def test_thresholds_most_specific_key_wins():
    t = AlertThresholds(default=0.1, per_statistic={"spearman": 0.05, "norm_vs_property.spearman.zipf": 0.01})
    assert t.for_row("norm_vs_property", "spearman", "zipf") == 0.01
    assert t.for_row("norm_vs_property", "spearman", "min_depth") == 0.05
    assert t.for_row("norm_vs_property", "partial_spearman_zipf", "min_depth") == 0.1
    assert t.tracks("norm_vs_property", "spearman") and t.tracks("retrieval_calibration", "auroc_query_norm")
    assert not t.tracks("norm_by_bin", "bin03_mean") and not t.tracks("retrieval_calibration", "coverage_0.5")


def test_config_rejects_unknown_fields_and_ambiguous_sources(tmp_path):
    bad = tmp_path / "audits.yaml"
    bad.write_text(yaml.safe_dump({"watch": [{"name": "m", "checkpoints": "/x", "hub": "a/b", "probes": ["p"]}]}))
    with pytest.raises(ValueError, match="exactly one of 'checkpoints' or 'hub'"):
        load_audits_config(bad)
    bad.write_text(yaml.safe_dump({"watch": [{"name": "m", "hub": "a/b", "probes": ["p"], "cronn": "x"}]}))
    with pytest.raises(ValueError, match="cronn"):
        load_audits_config(bad)


def test_checkpoints_in_natural_order(tmp_path):
    for name in ("step-1000", "step-900", "notes"):
        (tmp_path / name).mkdir()
    for name in ("step-1000", "step-900"):
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
    assert [d.name for d in checkpoint_dirs(tmp_path)] == ["step-900", "step-1000"]


def _wait_for_deployment(name: str, proc, timeout: float = 120) -> None:
    from prefect.client.orchestration import get_client

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"normaudit serve exited early: {proc.stdout.read()}")
        with get_client(sync_client=True) as client:
            try:
                client.read_deployment_by_name(name)
                return
            except Exception:  # noqa: BLE001 - not registered yet
                time.sleep(1)
    raise AssertionError(f"deployment {name} did not appear within {timeout}s")


def test_serve_audits_new_checkpoint_and_alerts(tmp_path, prefect_api):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    ckpts = tmp_path / "ckpts"
    build_tiny_model(ckpts / "step-1", seed=0)
    probes = tmp_path / "words.csv"
    pl.DataFrame({"item_id": [f"w{i}" for i in range(40)],
                  "text": [f"tree river stone {i}" if i % 2 else f"dog {i}" for i in range(40)],
                  "zipf": [1.0 + (i % 7) for i in range(40)], "depth": [float(i % 5) for i in range(40)]}
                 ).write_csv(probes)
    root = tmp_path / "root"
    config = AuditsConfig.model_validate({
        "root": str(root),
        # any change between two different weight sets alerts: on 40 items none is beyond its paired interval,
        # so the threshold alone decides (tests/test_compare_models.py checks the paired rule)
        "thresholds": {"default": 1e-6, "require_significant": False},
        "watch": [{"name": "tiny", "checkpoints": str(ckpts), "probes": [str(probes)], "cron": "0 0 1 1 *"}],
    })
    cfg_path = tmp_path / "audits.yaml"
    cfg_path.write_text(yaml.safe_dump(config.model_dump()))
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli.main", "serve", "--config", str(cfg_path)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_deployment("watch_releases/tiny", proc)
        first = run_deployment("watch_releases/tiny", timeout=400)
        assert first.state.is_completed(), first.state
        build_tiny_model(ckpts / "step-2", seed=1)  # a new checkpoint with other weights
        second = run_deployment("watch_releases/tiny", timeout=400)
        assert second.state.is_failed(), second.state
        assert "moved past their threshold" in str(second.state.message)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    con = open_catalog(open_store(load_settings(root=str(root))))
    runs = con.execute("select release, status from runs where model = 'tiny' order by started_at").fetchall()
    assert runs == [("step-1", "completed"), ("step-2", "alerted")]  # step-1 was not audited again
    counts = dict(con.execute("select release, count(*) from embeddings group by release").fetchall())
    assert counts == {"step-1": 40, "step-2": 40}
    alerts = con.execute("select previous_release, release, statistic, threshold from alerts").fetchall()
    assert alerts and all(a[:2] == ("step-1", "step-2") and a[3] == 1e-6 for a in alerts)
    # the change's paired interval, where the paired comparison has the statistic (norm_vs_property has)
    n, with_ci = con.execute("select count(*), count(ci_low) from alerts "
                             "where analysis = 'norm_vs_property'").fetchall()[0]
    assert n > 0 and with_ci == n
    assert not any(a[2].startswith("bin") for a in alerts)  # descriptive rows are not tracked


_INFO_LINE = re.compile(r"\|\s*INFO\s*\|")


def test_serve_once_prints_our_lines_and_no_prefect_info_line_unless_verbose(tmp_path):
    """Two checkpoints (audited, then compared with the previous) through the installed CLI, no PREFECT_API_URL:
    our own lines only; --verbose brings Prefect's per-task lines back."""
    ckpts = tmp_path / "ckpts"
    build_tiny_model(ckpts / "step-1", seed=0)
    build_tiny_model(ckpts / "step-2", seed=1)
    probes = tmp_path / "words.csv"
    pl.DataFrame({"item_id": [f"w{i}" for i in range(40)],
                  "text": [f"tree river stone {i}" if i % 2 else f"dog {i}" for i in range(40)],
                  "zipf": [1.0 + (i % 7) for i in range(40)]}).write_csv(probes)
    config = tmp_path / "audits.yaml"
    config.write_text(yaml.safe_dump({"root": str(tmp_path / "root"), "thresholds": {"default": 1e9},
                                      "watch": [{"name": "tiny", "checkpoints": str(ckpts), "probes": [str(probes)]}]}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "DASK_DISTRIBUTED__LOGGING")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    cli = [str(Path(sys.executable).parent / "normaudit"), "serve", "--config", str(config), "--once"]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert "tiny: auditing release step-1 (1 of 2)" in out.stdout and "tiny: auditing release step-2 (2 of 2)" \
        in out.stdout
    assert "tiny: audited 2 new release(s): step-1, step-2" in out.stdout
    assert not _INFO_LINE.search(console), console[-3000:]
    for noise in ("Finished in state", "prefect.", "distributed.", "View at"):
        assert noise not in console, noise
    assert out.stderr == "", out.stderr[-3000:]  # no warning either: nothing went wrong
    again = subprocess.run([*cli, "--verbose"], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "tiny: audited 0 new release(s)" in again.stdout, again.stderr[-3000:]
    assert _INFO_LINE.search(again.stdout + again.stderr)  # the flow's own lines, as Prefect logs them
