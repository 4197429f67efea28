"""The HTML report and the cross-release index, rendered from analyses run through the audit's step."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image

from pipeline.analysis.compare import ALERT_COLUMNS, AlertThresholds, write_alerts
from pipeline.analysis.report import render_report
from pipeline.analysis.report_html import fmt, render, table
from pipeline.analysis.sql import run_query
from pipeline.audit.context import AuditContext
from pipeline.audit.release_steps import run_analyses
from pipeline.probes import ProbeSet
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.runs import RunRecord, write_results, write_run
from pipeline.storage.store import Store, open_store
from tests.helpers import store_synthetic, word_probe_set
from tests.requirements import need_chromium

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _words(n: int, rng) -> tuple[ProbeSet, dict]:
    props = {
        "zipf": rng.uniform(1, 7, n),
        "min_depth": rng.integers(1, 12, n).astype(float),
        "rating_sd": rng.uniform(0.5, 2, n),
    }
    ps = word_probe_set("words", n, props)
    ids = ps.items["item_id"].to_list()
    pairs = pl.DataFrame(
        {"left_id": ids[0:60:2], "right_id": ids[1:60:2], "relation": "hypernym_of", "value": 1.0}
    )
    return ProbeSet(name="words", items=ps.items, properties=ps.properties, relations=pairs), props


def _retrieval(rng, nq: int = 30, nd: int = 60) -> tuple[ProbeSet, np.ndarray]:
    docs = rng.normal(size=(nd, 8))
    target = rng.integers(0, nd, nq)
    queries = docs[target] + rng.uniform(0.3, 2.0, (nq, 1)) * rng.normal(size=(nq, 8))
    items = pl.DataFrame(
        {
            "item_id": [f"q{i:02d}" for i in range(nq)] + [f"d{i:02d}" for i in range(nd)],
            "text": [f"t{i}" for i in range(nq + nd)],
            "kind": ["query"] * nq + ["doc"] * nd,
            "lang": "en",
            "source": "synthetic",
        }
    )
    qrels = pl.DataFrame(
        {
            "left_id": [f"q{i:02d}" for i in range(nq)],
            "right_id": [f"d{t:02d}" for t in target],
            "relation": "relevant",
            "value": 1.0,
        }
    )
    return ProbeSet(name="toy-ir", items=items, relations=qrels), np.vstack([queries, docs]).astype(
        np.float32
    )


def _audit(store: Store, release: str, day: int, slope: float, status: str = "completed") -> str:
    """Store two probe sets for a release, record a run, and run the audit's analyses step on it."""
    rng = np.random.default_rng(day)
    words, props = _words(150, rng)
    norms = 1 + slope * props["min_depth"] - 0.03 * props["zipf"] + rng.normal(0, 0.05, 150)
    store_synthetic(store, "m", release, words, norms, n_tokens=rng.integers(2, 5, 150))
    ir, vectors = _retrieval(rng)
    store_synthetic(
        store,
        "m",
        release,
        ir,
        np.linalg.norm(vectors.astype(np.float64), axis=1),
        vectors=vectors,
        n_tokens=rng.integers(3, 9, len(vectors)),
    )
    run = RunRecord(
        run_id=f"2024010{day}T000000-{release}",
        model="m",
        release=release,
        fingerprint=str(day) * 64,
        probe_set="words,toy-ir",
        params={},
        started_at=dt.datetime(2024, 1, day, tzinfo=dt.UTC),
    )
    write_run(store, run)
    run_analyses(AuditContext(load_settings(root=store.root_url), "m", release, run.run_id, resolved=None))
    run.status = status
    write_run(store, run)
    return run.run_id


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory):
    store = Store(str(tmp_path_factory.mktemp("report") / "root"))
    _audit(store, "v1", 1, 0.02)
    _audit(store, "v2", 2, 0.05)
    return store


def test_release_steps_run_in_child_processes(tmp_path, monkeypatch):
    """The analyses, the comparison and both pages run in child processes of the worker (their memory goes back
    when they end), and what they return comes back: the results rows, the previous release, the pages' URLs."""
    from pipeline.audit import release_steps
    from pipeline.audit.child import run_in_child

    called = []
    monkeypatch.setattr(release_steps, "run_in_child", lambda fn, *a: called.append(fn) or run_in_child(fn, *a))
    store = Store(str(tmp_path / "root"))
    _audit(store, "v1", 1, 0.02)
    run_id = _audit(store, "v2", 2, 0.05)
    ctx = AuditContext(load_settings(root=store.root_url), "m", "v2", run_id, resolved=None)
    previous, alerts = release_steps.compare_with_previous(ctx, AlertThresholds())
    report, models = release_steps.render_report(ctx), release_steps.render_models_page(ctx)
    assert called == [release_steps._analyse, release_steps._analyse, release_steps._compare,
                      release_steps._render_report, release_steps._render_models_page]
    assert previous == "v1" and "message" in alerts.columns
    assert report == store.url("reports", "m", "v2", "index.html") and Path(report).is_file()
    assert models == store.url("reports", "index.html") and Path(models).is_file()
    rows = open_catalog(store).execute("select count(*) from results where run_id = ?", [run_id]).fetchone()[0]
    assert rows > 0  # the child's analyses were stored


def test_release_drift_compares_with_the_previous_release(two_releases, tmp_path):
    store = two_releases
    con = open_catalog(store)
    drift = run_query(con, "release_drift", model="m", release="v2")
    assert set(drift["previous_release"]) == {"v1"}
    latest = {r: run_query(con, "report_results", model="m", release=r) for r in ("v1", "v2")}
    key = ["analysis", "probe_set", "property", "statistic"]
    joined = latest["v2"].join(latest["v1"], on=key, suffix="_prev", nulls_equal=True)
    assert drift.height == joined.height > 0
    check = drift.join(joined, on=key, nulls_equal=True)
    assert np.allclose(check["change"], check["value_right"] - check["value_prev"], atol=1e-12)
    depth = drift.filter((pl.col("property") == "min_depth") & (pl.col("statistic") == "spearman")).row(
        0, named=True
    )
    assert depth["change"] > 0 and depth["intervals_overlap"] is False  # the norm tracks depth more in v2
    assert run_query(con, "release_drift", model="m", release="v1").height == 0  # the first release


def test_release_drift_skips_failed_runs(tmp_path):
    store = Store(str(tmp_path / "root"))
    base = dict(model="m", probe_set="p", params={}, fingerprint="f" * 64)
    for run_id, release, day, status, value in (
        ("r1", "v1", 1, "completed", 0.1),
        ("r2", "v2", 2, "failed", 0.9),
        ("r3", "v3", 3, "running", 0.4),
    ):
        write_run(
            store,
            RunRecord(
                run_id=run_id,
                release=release,
                status=status,
                started_at=dt.datetime(2024, 1, day, tzinfo=dt.UTC),
                **base,
            ),
        )
        write_results(
            store,
            run_id,
            "a",
            pl.DataFrame(
                {
                    "run_id": run_id,
                    "analysis": "a",
                    "model": "m",
                    "release": release,
                    "probe_set": "p",
                    "property": "x",
                    "statistic": "s",
                    "value": value,
                    "ci_low": None,
                    "ci_high": None,
                    "n": 10,
                },
                schema_overrides={"ci_low": pl.Float64, "ci_high": pl.Float64},
            ),
        )
    row = run_query(open_catalog(store), "release_drift", model="m", release="v3").row(0, named=True)
    assert (row["previous_release"], row["change"]) == ("v1", pytest.approx(0.3))
    assert row["intervals_overlap"] is None


def test_audit_step_writes_one_results_file_per_analysis_with_rows(two_releases):
    store = two_releases
    files = {p.rsplit("/", 1)[1] for p in store.glob("results/20240102T000000-v2/*.parquet")}
    # no token table was stored, so token_norm_vs_frequency has no rows and no file
    assert files == {f"{a}.parquet" for a in ("norm_vs_property", "norm_by_bin", "hypernym_pairs",
                                              "retrieval_calibration", "retrieval_signals", "norm_rescoring")}
    res = open_catalog(store).execute(
        "select count(*), count(ci_low) from results where analysis = 'norm_vs_property' and release = 'v2'"
    ).fetchall()[0]
    assert res[0] > 0 and res[0] == res[1]  # every norm_vs_property row carries its bootstrap interval


def test_report_files_are_self_contained_and_complete(two_releases):
    store = two_releases
    url = render_report(store, "m", "v2")
    assert url.endswith("reports/m/v2/index.html")
    page = store.read_bytes("reports/m/v2/index.html").decode()
    for expected in (
        "norm_vs_zipf_words.png",
        "norm_vs_min_depth_words.png",
        "norm_vs_rating_sd_words.png",
        "selective_accuracy_toy-ir.png",
        "alpha_toy-ir.png",
    ):
        assert f"src='{expected}'" in page
    for src in re.findall(r"src='([^']+)'", page):
        data = store.read_bytes(f"reports/m/v2/{src}")
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, src
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "Change since the previous release (v1)" in page and "hypernym_of" in page
    assert "No alert" in page and "spearman" in page and "[+" in page  # a statistic with its interval
    index = store.read_bytes("reports/m/index.html").decode()
    assert "href='v1/index.html'" in index and "href='v2/index.html'" in index
    trends = re.findall(r"src='(trend_[^']+)'", index)
    assert (
        "trend_norm_vs_property_spearman.png" in trends
        and "trend_retrieval_calibration_auroc_query_norm.png" in trends
    )
    assert not any("bin" in t for t in trends)
    for src in trends:
        assert store.read_bytes(f"reports/m/{src}").startswith(PNG_MAGIC)


def test_model_index_of_a_single_release_draws_no_trends(tmp_path):
    store = Store(str(tmp_path / "root"))
    _audit(store, "v1", 1, 0.02)
    render_report(store, "m", "v1")
    index = store.read_bytes("reports/m/index.html").decode()
    assert "href='v1/index.html'" in index and "once a second release is audited" in index
    assert "trend_" not in index and not store.glob("reports/m/trend_*.png")


def test_report_shows_alerts_and_links_data_docs(two_releases):
    store = two_releases
    alert = {c: None for c in ALERT_COLUMNS} | {
        "run_id": "x",
        "model": "m",
        "release": "v2",
        "message": "spearman of min_depth moved past 0.1",
    }
    hostile = alert | {"message": "<script>alert(1)</script> & more"}  # messages may quote user input
    write_alerts(store, "x", pl.DataFrame([alert, hostile], schema=ALERT_COLUMNS))
    store.write_bytes_atomic("reports/data_docs/20240102T000000-v2/index.html", b"<html></html>")
    try:
        render_report(store, "m", "v2")
        page = store.read_bytes("reports/m/v2/index.html").decode()
        assert "2 alert(s)" in page and "spearman of min_depth moved past 0.1" in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page and "<script" not in page
        assert "href='../../data_docs/20240102T000000-v2/index.html'" in page
    finally:
        store.rm("alerts/x.parquet")
        store.rm("reports/data_docs", recursive=True)


def test_templates_escape_names_and_cells_but_keep_built_markup():
    hostile = "<script>alert(1)</script>"
    index = render("model_index.html.j2", title=hostile, model=hostile, releases=[hostile, "v2"], trends=[])
    assert "<script" not in index and index.count("&lt;script&gt;") == 4  # title, heading, link target, link text
    cells = table([{"name": hostile, "stat": fmt(0.5, 0.25, 0.75), "n": 1234, "ok": True, "x": float("nan")}])
    page = render(
        "report.html.j2", title="t", model="m", release="r", fingerprint=hostile, run_id="r1", status="completed",
        data_docs_href=None, alerts=[], inventory=cells, claims_table=None, norm_table=None, figures=[],
        other_table=None,
        previous=None, drift=None, n_results=1, results=cells,
    )
    assert "<script" not in page and "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page
    assert "<td class='num'>+0.500 <span class='muted'>[+0.250, +0.750]</span></td>" in page
    assert "<td class='num'>1,234</td>" in page and "<td>yes</td>" in page and "<td class='num'>—</td>" in page
    assert "no Data Docs built under this root" in page and "No alert" in page


def test_unknown_release_names_the_known_ones(two_releases):
    with pytest.raises(LookupError, match="v1"):
        render_report(two_releases, "m", "v9")


def test_report_on_an_s3_root(s3_env):
    store = open_store(load_settings(root=s3_env))
    rng = np.random.default_rng(0)
    words, props = _words(80, rng)
    store_synthetic(store, "m", "r1", words, 1 + 0.05 * props["min_depth"], n_tokens=rng.integers(2, 5, 80))
    write_run(
        store,
        RunRecord(
            run_id="run-s3",
            model="m",
            release="r1",
            fingerprint="f" * 64,
            probe_set="words",
            params={},
            status="completed",
        ),
    )
    write_results(
        store,
        "run-s3",
        "norm_vs_property",
        run_query(open_catalog(store), "norm_vs_property", model="m", release="r1").with_columns(
            pl.lit("run-s3").alias("run_id"),
            pl.lit("norm_vs_property").alias("analysis"),
            pl.lit(None, pl.Float64).alias("ci_low"),
            pl.lit(None, pl.Float64).alias("ci_high"),
        ),
    )
    url = render_report(store, "m", "r1")
    assert url.startswith("s3://") and store.exists("reports/m/r1/norm_vs_min_depth_words.png")
    assert store.exists("reports/m/index.html")


def test_report_renders_in_headless_chromium(two_releases, tmp_path):
    browser = need_chromium()
    render_report(two_releases, "m", "v2")
    shot = tmp_path / "shot.png"
    page = f"file://{two_releases.path('reports/m/v2/index.html')}"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1200,2400",
            page,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (2400, 1200)
    # text and plots drawn, not a blank or error page: many non-white rows over the page height
    assert (pixels.min(axis=1) < 128).mean() > 0.3
