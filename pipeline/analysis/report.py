"""HTML reports next to the data: one page per release, and a cross-release index per model.

``<root>/reports/<model>/<release>/index.html`` with its PNG plots beside it, and
``<root>/reports/<model>/index.html`` with one trend plot per statistic. Pages are
self-contained (inline CSS, no scripts, no external assets; images by relative
path), rendered from the Jinja2 templates in ``templates/`` and written through fsspec, so an
``s3://`` root works like a local one.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import polars as pl

from pipeline.analysis import plots
from pipeline.analysis.claims import p_text, test_text
from pipeline.analysis.report_html import Table, fmt, render, table
from pipeline.analysis.report_plots import Plot, pick, property_plots
from pipeline.analysis.sql import run_query
from pipeline.names import check_name
from pipeline.quality.datadocs import DOCS_DIR
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store

NORM_STATISTICS = ["spearman", "partial_spearman_zipf", "partial_spearman_n_tokens", "pearson_log_norm"]
DRIFT_COLUMNS = [
    "analysis", "probe_set", "property", "statistic", "previous_value", "value", "change", "intervals_overlap"
]
RESULT_COLUMNS = ["analysis", "probe_set", "property", "statistic", "value", "ci_low", "ci_high", "n", "run_id"]


def release_dir(model: str, release: str) -> str:
    """Folder of a release's report, relative to the storage root."""
    return f"reports/{check_name(model, 'model name')}/{check_name(release, 'release label')}"


def _retrieval_plots(store: Store, folder: str, results: pl.DataFrame) -> list[Plot]:
    out = []
    calib = results.filter(pl.col("analysis") == "retrieval_calibration")
    for (probe_set,), part in calib.group_by(["probe_set"], maintain_order=True):
        curves = {}
        for signal, label in (
            ("query_norm", "abstain on lowest query norm"),
            ("top1_cosine", "abstain on lowest top-1 cosine"),
        ):
            rows = part.filter(
                (pl.col("property") == f"selective_accuracy_{signal}")
                & pl.col("statistic").str.starts_with("coverage_")
            ).sort("statistic")
            if rows.height:
                coverage = np.asarray([float(s.split("_")[1]) for s in rows["statistic"]])
                curves[label] = (coverage, rows["value"].to_numpy())
        full = pick(results, "retrieval_calibration", probe_set, "retrieval", "mean_success_at_1")
        if not curves or full is None:
            continue
        aurocs = [
            f"AUROC({name}) = {row['value']:.3f}"
            for name, stat in (
                ("norm", "auroc_query_norm"),
                ("top-1 cos", "auroc_top1_cosine"),
                ("length", "auroc_query_n_tokens"),
            )
            if (row := pick(results, "retrieval_calibration", probe_set, "success_at_1", stat))
        ]
        title = f"{probe_set}: selective accuracy (n = {full['n']:,} queries)\n" + ", ".join(aurocs)
        name = f"selective_accuracy_{probe_set}.png"
        store.write_bytes_atomic(f"{folder}/{name}", plots.selective_accuracy(curves, full["value"], title))
        out.append(
            Plot(
                name,
                "Accuracy of the queries kept when abstaining on the lowest-signal ones; AUROC of "
                "each signal for success@1 (0.5 = no better than chance).",
            )
        )
    rescoring = results.filter(
        (pl.col("analysis") == "norm_rescoring") & (pl.col("statistic") == "mean_ndcg_at_10")
    )
    for (probe_set,), part in rescoring.group_by(["probe_set"], maintain_order=True):
        part = part.with_columns(pl.col("property").str.replace("alpha=", "").cast(pl.Float64).alias("alpha"))
        part = part.sort("alpha")
        title = f"{probe_set}: nDCG@10 with documents scored by cos · ‖d‖^α (n = {part['n'].max():,} queries)"
        name = f"alpha_{probe_set}.png"
        store.write_bytes_atomic(
            f"{folder}/{name}",
            plots.alpha_curve(
                part["alpha"].to_numpy(),
                part["value"].to_numpy(),
                part["ci_low"].to_numpy(),
                part["ci_high"].to_numpy(),
                title,
            ),
        )
        out.append(
            Plot(name, "Mean nDCG@10 per α with a normal-approximation 95% interval; α = 0 is plain cosine.")
        )
    return out


def _norm_table(results: pl.DataFrame) -> Table | None:
    rows = results.filter(pl.col("analysis") == "norm_vs_property")
    if rows.height == 0:
        return None
    out = []
    for (probe_set, prop), part in rows.group_by(["probe_set", "property"], maintain_order=True):
        cells = {
            r["statistic"]: fmt(r["value"], r["ci_low"], r["ci_high"]) for r in part.iter_rows(named=True)
        }
        out.append(
            {
                "probe set": probe_set,
                "property": prop,
                "n": int(part["n"].max()),
                **{s: cells.get(s, "—") for s in NORM_STATISTICS},
            }
        )
    return table(out, ["probe set", "property", "n", *NORM_STATISTICS])


def _other_table(results: pl.DataFrame) -> Table | None:
    rows = results.filter(
        pl.col("analysis").is_in(["hypernym_pairs", "token_norm_vs_frequency"])
        | ((pl.col("analysis") == "retrieval_calibration") & ~pl.col("property").str.starts_with("selective"))
        | (pl.col("analysis") == "retrieval_signals")
    )
    if rows.height == 0:
        return None
    return table(
        _with_ci_column(rows), ["analysis", "probe_set", "property", "statistic", "value [95% CI]", "n"]
    )


def _with_ci_column(rows: pl.DataFrame) -> list[dict]:
    return [
        {**r, "value [95% CI]": fmt(r["value"], r["ci_low"], r["ci_high"])}
        for r in rows.iter_rows(named=True)
    ]


CLAIM_TABLE_COLUMNS = ["claim", "verdict", "population", "test", "value [95% CI]", "n", "p (Holm)", "evidence"]


def _claims_table(con: duckdb.DuckDBPyConnection, model: str, release: str) -> Table | None:
    """The claims of the paper decided for this release (pipeline/analysis/claims.py), one row per test."""
    claims = run_query(con, "report_claims", model=model, release=release)
    if not claims.height:
        return None
    rows = []
    for r in claims.iter_rows(named=True):
        rows.append({
            "claim": r["claim"].replace("_", " "), "verdict": r["verdict"], "population": r["population"],
            "test": f"{test_text(r)}, claimed {r['direction']} vs {r['null_value']:g}",
            "value [95% CI]": fmt(r["value"], r["ci_low"], r["ci_high"]), "n": r["n"],
            "p (Holm)": p_text(r["p_holm"], r["n_resamples"]), "evidence": r["evidence"]})
    return table(rows, CLAIM_TABLE_COLUMNS)


def _alerts(con: duckdb.DuckDBPyConnection, model: str, release: str) -> list[str] | None:
    """The release's alert messages; ``None`` when the store records no alerts at all."""
    has_view = con.execute("select count(*) from duckdb_views() where view_name = 'alerts'").fetchall()[0][0]
    if not has_view:
        return None
    alerts = con.sql(
        "select message from alerts where model = $model and release = $release",
        params={"model": model, "release": release},
    ).pl()
    return [str(m) for m in alerts["message"].to_list()]


def _data_docs_href(store: Store, run_ids: list[str]) -> str | None:
    """Link to the Data Docs of the newest run of the release that has them (relative to the page)."""
    for sub in [*run_ids, ""]:
        rel = "/".join(p for p in (DOCS_DIR, sub, "index.html") if p)
        if store.exists(rel):
            return "../../" + rel.removeprefix("reports/")
    return None


def render_report(store: Store, model: str, release: str, memory_limit: str | None = None) -> str:
    """Write the release's report (page and plots) and refresh the model's index; returns the page URL.
    ``memory_limit``: DuckDB's (default: its own); the plots read no more than a grid's counts per probe set
    (:mod:`pipeline.analysis.report_plots`).

    Raises:
        LookupError: nothing of ``model`` at ``release`` is stored under the root.
    """
    con = open_catalog(store, memory_limit=memory_limit)
    folder = release_dir(model, release)
    inventory = run_query(con, "report_inventory", model=model, release=release)
    results = run_query(con, "report_results", model=model, release=release)
    if inventory.height == 0 and results.height == 0:
        known = con.execute(
            "select distinct release from embeddings where model = $m order by 1", {"m": model}
        ).fetchall()
        raise LookupError(
            f"nothing stored for model {model!r} release {release!r} under {store.root_url}; "
            f"releases of {model!r}: {[r[0] for r in known] or 'none'}. Run `normaudit audit` first."
        )
    runs = run_query(con, "report_runs", model=model, release=release)
    figures = property_plots(con, store, folder, model, release, results, inventory=inventory) + _retrieval_plots(
        store, folder, results
    )
    drift = run_query(con, "release_drift", model=model, release=release)
    latest = runs.row(0, named=True) if runs.height else {}
    page = render(
        "report.html.j2",
        title=f"normaudit {model} @ {release}",
        model=model,
        release=release,
        fingerprint=str(latest.get("fingerprint", "—"))[:16],
        run_id=str(latest.get("run_id", "—")),
        status=str(latest.get("status", "—")),
        data_docs_href=_data_docs_href(store, runs["run_id"].to_list()),
        alerts=_alerts(con, model, release),
        inventory=table(inventory),
        claims_table=_claims_table(con, model, release),
        norm_table=_norm_table(results),
        figures=figures,
        other_table=_other_table(results),
        previous=drift["previous_release"][0] if drift.height else None,
        drift=(
            table(drift.filter(pl.col("analysis") != "norm_by_bin"), DRIFT_COLUMNS) if drift.height else None
        ),
        n_results=results.height,
        results=table(results, RESULT_COLUMNS),
    )
    store.write_bytes_atomic(f"{folder}/index.html", page.encode())
    render_model_index(store, model, con)
    return store.url(folder, "index.html")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


STEP_ROWS_SHOWN = 10


def release_steps(con: duckdb.DuckDBPyConnection, model: str, releases: list[str]) -> list[dict]:
    """Per consecutive pair of releases (audit order): how many statistics the paired comparison checked,
    how many differ (95% interval excludes 0), and the largest differing changes."""
    frame = run_query(con, "report_release_steps", model=model)
    order = {r: i for i, r in enumerate(releases)}
    out = []
    for (base, release), part in frame.group_by(["base_release", "release"], maintain_order=True):
        differs = part.filter(pl.col("verdict") == "differs").drop_nulls(
            ["base_value", "value", "difference", "ci_low", "ci_high"])
        out.append({"base": base, "release": release, "n": part.height, "n_differs": differs.height,
                    "rows": differs.head(STEP_ROWS_SHOWN).to_dicts(),
                    "order": order.get(release, len(order))})
    return sorted(out, key=lambda step: step["order"])


def render_model_index(store: Store, model: str, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """Write ``reports/<model>/index.html``: one trend plot per statistic across releases; returns its URL."""
    con = con or open_catalog(store)
    folder = f"reports/{check_name(model, 'model name')}"
    trends = run_query(con, "report_trends", model=model)
    releases = (
        trends.select("release", "release_order").unique().sort("release_order")["release"].to_list()
        if trends.height
        else []
    )
    figures = []
    if len(releases) < 2:  # a trend needs two points; a page of single dots costs seconds and says nothing
        trends = trends.clear()
    position = {r: i for i, r in enumerate(releases)}
    for (analysis, statistic), part in trends.group_by(["analysis", "statistic"], maintain_order=True):
        lines = {}
        for (probe_set, prop), series in part.group_by(["probe_set", "property"], maintain_order=True):
            values = np.full(len(releases), np.nan)
            lows, highs = values.copy(), values.copy()
            for r in series.iter_rows(named=True):
                i = position[r["release"]]
                values[i] = r["value"]
                lows[i] = np.nan if r["ci_low"] is None else r["ci_low"]
                highs[i] = np.nan if r["ci_high"] is None else r["ci_high"]
            lines[f"{probe_set} · {prop}"] = (values, lows, highs)
        shown = dict(list(lines.items())[:8])
        latest_n = int(part.filter(pl.col("release") == releases[-1])["n"].max() or 0)
        title = f"{analysis} · {statistic} (n = {latest_n:,} at {releases[-1]})"
        name = f"trend_{_slug(analysis)}_{_slug(statistic)}.png"
        store.write_bytes_atomic(
            f"{folder}/{name}", plots.trend(releases, shown, plots.statistic_label(statistic), title)
        )
        more = f" ({len(lines) - 8} more lines in the release reports)" if len(lines) > 8 else ""
        figures.append(
            Plot(
                name,
                f"{analysis} · {statistic}: one line per probe set and property; bars: 95% intervals where "
                f"recorded{more}.",
            )
        )
    page = render(
        "model_index.html.j2", title=f"normaudit {model}", model=model, releases=releases, trends=figures,
        steps=release_steps(con, model, releases),
    )
    store.write_bytes_atomic(f"{folder}/index.html", page.encode())
    return store.url(folder, "index.html")
