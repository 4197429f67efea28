"""The models page, ``<root>/reports/index.html``: every audited model and release side by side.

Rows are (model, release) pairs, columns the main statistics with their 95% intervals (per probe set,
one table per three properties, so the page fits the window at any number of them), and one forest plot per
probe property: each model@release's Spearman ρ of the norm with the property beside its partial ρ given
word frequency. Links go to each release's own report and to every stored pairwise comparison (view
``comparisons``). Everything is written through the store, so an ``s3://`` root works like a local one.
Importing this module loads matplotlib (seconds): callers import it inside the function that renders.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import polars as pl
from markupsafe import escape
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.analysis import plots
from pipeline.analysis.comparison_page import COMPARE_DIR, comparison_file
from pipeline.analysis.report_html import Html, fmt, render, table
from pipeline.analysis.sql import run_query
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store

PAGE = "reports/index.html"
# Column titles of the main statistics, by (analysis, statistic); norm_vs_property's name the property too
LABELS = {
    ("norm_vs_property", "spearman"): "ρ",
    ("norm_vs_property", "partial_spearman_zipf"): "ρ | zipf",
    ("hypernym_pairs", "share_hyponym_norm_greater"): "share hyponym norm larger",
    ("hypernym_pairs", "share_hyponym_norm_greater_zipf_matched"): "same, zipf-matched pairs",
    ("retrieval_calibration", "auroc_query_norm"): "AUROC(query norm) for",
    ("token_norm_vs_frequency", "spearman"): "token norm ρ with zipf",
}
RAW, PARTIAL = "#1f77b4", "#d62728"
# Per table: the ρ and ρ | zipf of three properties. Six interval columns beside the row labels fit the
# page's 1,100-pixel column; further properties go to further tables instead of past the window's edge.
MAX_STAT_COLUMNS = 6


def _column(analysis: str, prop: str | None, statistic: str) -> str:
    label = LABELS.get((analysis, statistic), statistic)
    if analysis == "norm_vs_property":
        return f"{prop} {label}"
    # one AUROC per outcome (success_at_1, success_at_10): the outcome names the column
    return f"{label} {prop}" if analysis == "retrieval_calibration" else label


def _link(href: str, text: str) -> Html:
    return Html(f"<a href='{escape(href)}'>{escape(text)}</a>")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def _comparisons(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """The distinct (base, other) pairs of the stored comparisons; empty when none is stored."""
    has_view = con.execute("select count(*) from duckdb_views() where view_name = 'comparisons'").fetchall()[0][0]
    if not has_view:
        return pl.DataFrame(schema={c: pl.String for c in ("base_model", "base_release", "model", "release")})
    return con.sql(
        "select distinct base_model, base_release, model, release from comparisons order by all"
    ).pl()


def forest_plot(labels: list[str], raw: np.ndarray, partial: np.ndarray, title: str) -> bytes:
    """Each row's ρ (blue) and partial ρ given zipf (red) with their 95% intervals; ``raw`` and ``partial``
    are ``(n, 3)`` arrays of value, low, high (NaN where absent). Returns PNG bytes; the figure grows by a
    fixed height per row, so the row labels never crowd however many releases are shown."""
    fig = Figure(figsize=(7.5, 1.6 + 0.42 * len(labels)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    y = np.arange(len(labels))[::-1].astype(float)
    for values, colour, offset, name in ((raw, RAW, 0.14, "ρ"), (partial, PARTIAL, -0.14, "partial ρ | zipf")):
        ok = np.isfinite(values[:, 0])
        if not ok.any():
            continue
        v, lo, hi = values[ok, 0], values[ok, 1], values[ok, 2]
        has_ci = np.isfinite(lo) & np.isfinite(hi)
        err = np.vstack([np.where(has_ci, v - lo, 0.0), np.where(has_ci, hi - v, 0.0)])
        ax.errorbar(v, y[ok] + offset, xerr=err, fmt="o", ms=5, color=colour, capsize=3, lw=1.2, label=name)
    ax.axvline(0.0, color="#888", lw=1, ls="--")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(-0.7, len(labels) - 0.3)
    # two lines: in one, the label is wider than the axes and its ends were cut off
    ax.set_xlabel("Spearman ρ of the raw norm with the property (−1 to 1)\nbars: 95% bootstrap intervals",
                  fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    if ax.get_legend_handles_labels()[0]:  # beside the axes, where it covers no interval
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10)
    return plots.to_png(fig)


def _forest_plots(store: Store, results: pl.DataFrame, order: list[str]) -> list[dict]:
    """One forest plot per (probe set, property) of norm_vs_property, written beside the page."""
    out = []
    norm = results.filter(pl.col("analysis") == "norm_vs_property")
    for (probe_set, prop), part in norm.group_by(["probe_set", "property"], maintain_order=True):
        labels = [lab for lab in order if lab in set(part["label"])]
        arrays = {}
        for statistic in ("spearman", "partial_spearman_zipf"):
            arr = np.full((len(labels), 3), np.nan)
            for r in part.filter(pl.col("statistic") == statistic).iter_rows(named=True):
                i = labels.index(r["label"])
                arr[i] = [r["value"], *(np.nan if r[c] is None else r[c] for c in ("ci_low", "ci_high"))]
            arrays[statistic] = arr
        n = part["n"].drop_nulls()
        n_text = f"n = {n.min():,}–{n.max():,} items" if n.len() and n.min() != n.max() else (
            f"n = {n.max():,} items" if n.len() else "n unknown")
        name = f"forest_{_slug(probe_set)}_{_slug(prop)}.png"
        png = forest_plot(labels, arrays["spearman"], arrays["partial_spearman_zipf"],
                          f"{probe_set}: norm vs {prop} ({n_text})")
        store.write_bytes_atomic(f"reports/{name}", png)
        out.append({"file": name, "caption": (
            f"{probe_set} · {prop}: each model@release's Spearman ρ (blue) and partial ρ with word frequency "
            "partialled out (red), with 95% bootstrap intervals; the dashed line is no association.")})
    return out


def _column_groups(part: pl.DataFrame) -> list[tuple[bool, str, list[tuple[tuple, str]]]]:
    """A probe set's statistics as ``(is norm_vs_property, group name, [(key, column title)])``: one group per
    norm_vs_property property (its ρ, then ρ given zipf), then one per other analysis."""
    rank = list(LABELS)  # within a group: ρ, then ρ given zipf
    keys = part.select("analysis", "property", "statistic").unique(maintain_order=True).iter_rows()
    groups: dict[tuple[bool, str], list[tuple[tuple, str]]] = {}
    for key in sorted(keys, key=lambda k: (
            k[0] != "norm_vs_property", k[0], k[1] or "",
            rank.index((k[0], k[2])) if (k[0], k[2]) in rank else len(rank))):
        norm = key[0] == "norm_vs_property"
        groups.setdefault((norm, key[1] if norm else key[0]), []).append((key, _column(*key)))
    return [(norm, name, columns) for (norm, name), columns in groups.items()]


def _packed(groups: list[tuple[bool, str, list]]) -> list[list[tuple[bool, str, list]]]:
    """Consecutive groups of one kind, packed into tables of at most MAX_STAT_COLUMNS statistics (a larger
    group gets a table of its own)."""
    tables: list[list] = []
    width = 0
    for group in groups:
        if not tables or tables[-1][-1][0] != group[0] or width + len(group[2]) > MAX_STAT_COLUMNS:
            tables.append([])
            width = 0
        tables[-1].append(group)
        width += len(group[2])
    return tables


def _tables(results: pl.DataFrame, order: list[str]) -> list[dict]:
    """Per probe set and group of properties, a table: model@release rows, the group's main statistics with
    intervals as columns. Grouping keeps every table within the page's width at any number of properties."""
    out = []
    for (probe_set,), part in results.group_by(["probe_set"], maintain_order=True):
        cells = {(r["label"], r["analysis"], r["property"], r["statistic"]): r for r in part.iter_rows(named=True)}
        groups = _column_groups(part)
        n_properties = sum(norm for norm, _, _ in groups)
        done = 0
        for packed in _packed(groups):
            columns = [column for _, _, cols in packed for column in cols]
            names = ", ".join(name for _, name, _ in packed)
            if packed[0][0]:
                caption = f"norm vs {names}" + (
                    f" (properties {done + 1}–{done + len(packed)} of {n_properties})"
                    if len(packed) < n_properties else "")
                done += len(packed)
            else:
                caption = names.replace("_", " ")
            rows = []
            for label in order:
                mine = {key: cells[(label, *key)] for key, _ in columns if (label, *key) in cells}
                if not mine:  # nothing of this group measured for the release
                    continue
                rows.append({"model @ release": label, "n (most)": max(r["n"] or 0 for r in mine.values()),
                             **{title: fmt(mine[key]["value"], mine[key]["ci_low"], mine[key]["ci_high"])
                                if key in mine else "—" for key, title in columns}})
            out.append({"probe_set": probe_set, "caption": caption,
                        "table": table(rows, ["model @ release", "n (most)", *(t for _, t in columns)])})
    return out


def render_models_page(store: Store, con: duckdb.DuckDBPyConnection | None = None) -> str:
    """Write ``reports/index.html`` and its forest plots; returns the page's URL."""
    con = con or open_catalog(store)
    releases = run_query(con, "models_page_releases")
    results = run_query(con, "models_page_results")
    order = [f"{m}@{r}" for m, r in releases.select("model", "release").iter_rows()]
    results = results.with_columns(pl.format("{}@{}", "model", "release").alias("label")).filter(
        pl.col("label").is_in(order)
    ).sort("analysis", "probe_set", "property", "statistic")
    reports = set(store.glob("reports/*/*/index.html"))
    audited = [
        {"model": r["model"], "release": r["release"], "status": r["status"],
         "audited": f"{r['started_at']:%Y-%m-%d %H:%M}" if r["started_at"] else "—",
         "report": (_link(f"{r['model']}/{r['release']}/index.html", "report")
                    if f"reports/{r['model']}/{r['release']}/index.html" in reports else "—")}
        for r in releases.iter_rows(named=True)
    ]
    pages = set(store.glob(f"{COMPARE_DIR}/*.html"))
    comparisons = []
    for r in _comparisons(con).iter_rows(named=True):
        base, other = (r["base_model"], r["base_release"]), (r["model"], r["release"])
        name = comparison_file(base, other)
        if f"{COMPARE_DIR}/{name}" in pages:
            comparisons.append({"href": f"compare/{name}", "text": f"{'@'.join(other)} against {'@'.join(base)}"})
    page = render(
        "models.html.j2", title="normaudit: models", releases=table(audited, list(audited[0]) if audited else []),
        n_releases=len(audited), tables=_tables(results, order), figures=_forest_plots(store, results, order),
        comparisons=comparisons,
    )
    store.write_bytes_atomic(PAGE, page.encode())
    return store.url(PAGE)
