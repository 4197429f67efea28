"""Paired comparisons in use: release alerts on the paired interval, `normaudit compare` across models and
releases through the installed CLI, and the models page (issue 18)."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.analysis.compare import AlertThresholds, compare_runs, previous_release
from pipeline.analysis.paired import paired_comparison
from pipeline.audit.context import AuditContext
from pipeline.audit.release_steps import compare_with_previous, run_analyses
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.runs import RunRecord, write_run
from pipeline.storage.store import Store
from tests.builders import build_tiny_model
from tests.helpers import store_synthetic, word_probe_set

CLI = Path(sys.executable).parent / "normaudit"
N_SMALL = 30  # a small probe set: a Spearman ρ moves by ~0.2 on noise alone
KEY = ["analysis", "probe_set", "property", "statistic"]


def _release(store: Store, release: str, day: int, norms: np.ndarray, props: dict) -> str:
    """Store one release's norms for a fixed probe set, record a finished run, run the audit's analyses."""
    ps = word_probe_set("few", len(norms), props)
    store_synthetic(store, "m", release, ps, norms)
    run = RunRecord(run_id=f"2024010{day}T000000-{release}", model="m", release=release, fingerprint=str(day) * 64,
                    probe_set="few", params={}, started_at=dt.datetime(2024, 1, day, tzinfo=dt.UTC))
    write_run(store, run)
    run_analyses(AuditContext(load_settings(root=store.root_url), "m", release, run.run_id, resolved=None))
    run.status = "completed"
    write_run(store, run)
    return run.run_id


@pytest.fixture(scope="module")
def small_releases(tmp_path_factory):
    """v1 and v2: independent noise on 30 items (no real change); v3: the norm follows depth (a real one)."""
    rng = np.random.default_rng(7)
    props = {"zipf": rng.uniform(1, 7, N_SMALL), "min_depth": rng.integers(1, 12, N_SMALL).astype(float)}
    store = Store(str(tmp_path_factory.mktemp("alerts") / "root"))
    runs = {
        "v1": _release(store, "v1", 1, 1 + rng.normal(0, 0.1, N_SMALL), props),
        "v2": _release(store, "v2", 2, 1 + rng.normal(0, 0.1, N_SMALL), props),
        "v3": _release(store, "v3", 3, 1 + 0.2 * props["min_depth"] + rng.normal(0, 0.05, N_SMALL), props),
    }
    return store, runs


def _alerts(store: Store, runs: dict, release: str, thresholds: AlertThresholds):
    con = open_catalog(store)
    previous = previous_release(con, "m", release)
    paired = paired_comparison(con, ("m", previous[0]), ("m", release), resamples=300)
    comparison, alerts = compare_runs(con, "m", release, runs[release], previous, thresholds, paired)
    return comparison, alerts


def test_release_compared_with_itself_is_exactly_zero_and_never_alerts(small_releases):
    store, runs = small_releases
    con = open_catalog(store)
    paired = paired_comparison(con, ("m", "v1"), ("m", "v1"), resamples=200)
    assert paired.height > 0 and paired["difference"].drop_nulls().len() > 0
    assert (paired["difference"].drop_nulls() == 0.0).all()
    assert "differs" not in paired["verdict"].to_list()
    for strict in (True, False):
        comparison, alerts = compare_runs(con, "m", "v1", runs["v1"], ("v1", runs["v1"]),
                                          AlertThresholds(default=0.0, require_significant=strict), paired)
        assert comparison.height > 0 and (comparison["change"] == 0.0).all()
        assert alerts.height == 0


def test_noise_above_the_threshold_alerts_only_without_require_significant(small_releases):
    store, runs = small_releases
    comparison, alerts = _alerts(store, runs, "v2", AlertThresholds(default=0.05))
    spearman = comparison.filter((pl.col("analysis") == "norm_vs_property") & (pl.col("statistic") == "spearman"))
    noisy = spearman.filter((pl.col("change").abs() > 0.05) & (pl.col("change_ci_low") < 0)
                            & (pl.col("change_ci_high") > 0))
    assert noisy.height > 0, spearman  # the case the rule is for: a move past the threshold within noise
    alerted = alerts.join(noisy.select(KEY), on=KEY, nulls_equal=True)
    assert alerted.height == 0, alerts["message"].to_list()

    _, loose = _alerts(store, runs, "v2", AlertThresholds(default=0.05, require_significant=False))
    assert loose.join(noisy.select(KEY), on=KEY, nulls_equal=True).height == noisy.height


def test_real_shift_alerts_with_both_intervals_named(small_releases):
    store, runs = small_releases
    _, alerts = _alerts(store, runs, "v3", AlertThresholds(default=0.05))
    depth = alerts.filter((pl.col("statistic") == "spearman") & (pl.col("property") == "min_depth"))
    assert depth.height == 1
    row = depth.row(0, named=True)
    assert row["ci_low"] > 0 and row["ci_low"] <= row["change"] <= row["ci_high"]  # the change's paired CI
    msg = row["message"]
    assert "paired 95% CI of the change" in msg and f"on {N_SMALL} shared items" in msg
    assert len(re.findall(r"\[[+-]\d\.\d{4}, [+-]\d\.\d{4}\]", msg)) == 3  # v2's CI, v3's CI, the change's


def test_audit_step_stores_the_comparison_and_its_page(small_releases):
    store, runs = small_releases
    ctx = AuditContext(load_settings(root=store.root_url), "m", "v3", runs["v3"], resolved=None)
    previous, alerts = compare_with_previous(ctx, AlertThresholds(default=0.05))
    assert previous == "v2" and alerts.height > 0
    con = open_catalog(store)
    stored = con.sql("select distinct base_release, release from comparisons").fetchall()
    assert stored == [("v2", "v3")]
    assert con.sql("select count(*) from alerts where ci_low is not null").fetchall()[0][0] == alerts.height
    page = (Path(store.root_url) / "reports/compare/m@v3__vs__m@v2.html").read_text()
    assert "min_depth" in page and "differs" in page and "alert(s)" in page


# ---------- through the installed CLI: two tiny models, one of them audited at two releases ----------

def _cli(*args: str, check: int | None = 0, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | extra
    out = subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True, timeout=600)
    if check is not None:
        assert out.returncode == check, out.stdout + out.stderr
    return out


def test_release_form_exits_3_only_on_a_change_beyond_noise(small_releases):
    store, _ = small_releases
    args = ("compare", "--model", "m", "--root", store.root_url, "--threshold", "0.05", "--resamples", "300")
    noise = _cli(*args, "--release", "v2", check=None)
    loose = _cli(*args, "--release", "v2", "--no-require-significant", check=3)
    strict_alerts, loose_alerts = (
        {line for line in out.stdout.splitlines() if line.startswith("alert:")} for out in (noise, loose))
    assert "m@v2 against m@v1" in noise.stdout
    # of the moves past 0.05 (a noisy Spearman among them), only those beyond their paired interval alert
    assert strict_alerts < loose_alerts and any("alert: norm_vs_property.spearman" in a for a in loose_alerts)
    assert noise.returncode == (3 if strict_alerts else 0)
    shift = _cli(*args, "--release", "v3", check=3)
    assert "alert: norm_vs_property.spearman of min_depth on few" in " ".join(shift.stdout.split())


@pytest.fixture(scope="module")
def audited(tmp_path_factory, tiny_model_dir):
    """tiny-a at r1 and r2 (the same weights), tiny-b (other weights), audited on 40 words in one root."""
    tmp = tmp_path_factory.mktemp("models")
    other_model = build_tiny_model(tmp / "tiny-b", seed=1)
    probes = tmp / "words.csv"
    pl.DataFrame({"item_id": [f"w{i}" for i in range(40)],
                  "text": [f"tree river stone {i}" if i % 2 else f"dog {i}" for i in range(40)],
                  "zipf": [1.0 + (i % 7) for i in range(40)], "depth": [float(i % 5) for i in range(40)]}
                 ).write_csv(probes)
    root = str(tmp / "root")
    for model, name, release in ((tiny_model_dir, "tiny-a", "r1"), (other_model, "tiny-b", "b1"),
                                 (tiny_model_dir, "tiny-a", "r2")):
        _cli("audit", "--model", str(model), "--name", name, "--release", release, "--probes", str(probes),
             "--root", root)
    return root


def test_a_rerelease_of_the_same_weights_changes_nothing_and_does_not_alert(audited):
    con = open_catalog(Store(audited))
    assert con.sql("select status from runs where release = 'r2'").fetchall() == [("completed",)]
    rows = con.sql("select difference, verdict from comparisons where base_release = 'r1' and release = 'r2'").pl()
    assert rows.height > 0 and (rows["difference"].drop_nulls() == 0.0).all()
    assert "differs" not in rows["verdict"].to_list()
    out = _cli("compare", "--model", "tiny-a", "--root", audited, "--resamples", "100")  # release form: r2 vs r1
    assert "tiny-a@r2 against tiny-a@r1" in out.stdout and "alert" not in out.stdout


def test_compare_two_models_through_the_cli(audited):
    out = _cli("compare", "--model", "tiny-a", "--against", "tiny-b", "--root", audited, "--resamples", "200",
               "--seed", "3")
    assert "tiny-a@r2 against tiny-b@b1" in out.stdout
    assert "units embedded by one side only (left out): words: 40 shared, 0 only in tiny-b@b1, 0 only in tiny-a@r2" \
        in " ".join(out.stdout.split())
    page = Path(audited) / "reports/compare/tiny-a@r2__vs__tiny-b@b1.html"
    assert f"page: {page}" in out.stdout and page.exists()
    con = open_catalog(Store(audited))
    stored = con.sql("select * from comparisons where model = 'tiny-a' and base_model = 'tiny-b'").pl()
    assert stored.height > 0 and set(stored["n_resamples"]) == {200} and set(stored["n_shared"]) <= {40}
    assert set(stored["verdict"]) <= {"differs", "no evidence", "undefined"}
    assert (stored["difference"] != 0).any()  # other weights: other norms

    bad = _cli("compare", "--model", "tiny-a", "--against", "nope", "--root", audited, check=1)
    assert "'nope'" in bad.stderr and "tiny-a" in bad.stderr and "tiny-b" in bad.stderr
    bad = _cli("compare", "--model", "tiny-a", "--release", "r9", "--against", "tiny-b", "--root", audited, check=1)
    assert "'r9'" in bad.stderr and "['r1', 'r2']" in bad.stderr


def test_compare_and_report_hold_duckdb_to_the_analysis_memory_setting(audited):
    """`normaudit compare` and `normaudit report` run DuckDB under NORMAUDIT_ANALYSIS_MEMORY, as the audit's own
    comparison and report do (left at DuckDB's default, 80% of the machine, the report of 10 M items held 3.3 GiB):
    a budget too small is said as that setting, and the default one finishes."""
    for args, what in ((("compare", "--model", "tiny-a", "--against", "tiny-b", "--resamples", "50"), "the comparison"),
                       (("report", "--model", "tiny-a"), "the report")):
        out = _cli(*args, "--root", audited, check=1, NORMAUDIT_ANALYSIS_MEMORY="1MB")
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"{what} needed more than NORMAUDIT_ANALYSIS_MEMORY=1MB of DuckDB memory" \
            in errors[0], out.stderr[-3000:]
        _cli(*args, "--root", audited, check=0)


def test_models_page_lists_both_models_links_comparisons_and_has_forest_plots(audited):
    _cli("compare", "--model", "tiny-a", "--against", "tiny-b", "--root", audited, "--resamples", "50")
    out = _cli("report", "--models", "--root", audited)
    index = Path(audited) / "reports/index.html"
    assert out.stdout.strip() == str(index)
    page = index.read_text()
    for label in ("tiny-a@r1", "tiny-a@r2", "tiny-b@b1"):
        assert label in page
    assert "href='compare/tiny-a@r2__vs__tiny-b@b1.html'" in page
    assert "href='compare/tiny-a@r2__vs__tiny-a@r1.html'" in page  # the audit's own release comparison
    assert "href='tiny-b/b1/index.html'" in page
    assert page.index("<th>depth ρ</th>") < page.index("<th>depth ρ | zipf</th>")
    plots = sorted(p.name for p in index.parent.glob("forest_*.png"))
    assert plots == ["forest_words_depth.png", "forest_words_zipf.png"]
    for name in plots:
        assert f"src='{name}'" in page and (index.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
