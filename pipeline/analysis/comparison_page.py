"""The HTML page of one paired comparison: ``<root>/reports/compare/<A>@<R>__vs__<B>@<S>.html``.

Written through the store (fsspec), so an ``s3://`` root works like a local one; no plots, so no matplotlib.
"""

from __future__ import annotations

import polars as pl

from pipeline.analysis.report_html import fmt, render, table
from pipeline.names import check_name
from pipeline.storage.store import Store

COMPARE_DIR = "reports/compare"
COLUMNS = ["analysis", "probe_set", "property", "statistic", "base", "other", "difference [paired 95% CI]",
           "n shared", "verdict"]


def side_label(side: tuple[str, str]) -> str:
    """``model@release``, both checked as path-safe names."""
    model, release = side
    return f"{check_name(model, 'model name')}@{check_name(release, 'release label')}"


def comparison_file(base: tuple[str, str], other: tuple[str, str]) -> str:
    """File name of the page comparing ``other`` against ``base`` (relative to ``reports/compare``)."""
    return f"{side_label(other)}__vs__{side_label(base)}.html"


def comparison_path(base: tuple[str, str], other: tuple[str, str]) -> str:
    """Path of the page relative to the storage root."""
    return f"{COMPARE_DIR}/{comparison_file(base, other)}"


def only_one_side(frame: pl.DataFrame) -> pl.DataFrame:
    """Per probe set, the units both sides embedded and those only one side did (the most any statistic saw)."""
    if frame.height == 0:
        return pl.DataFrame(schema={"probe_set": pl.String, "n_shared": pl.Int64, "n_only_base": pl.Int64,
                                    "n_only_other": pl.Int64})
    return (
        frame.group_by("probe_set", maintain_order=True)
        .agg(pl.col("n_shared", "n_only_base", "n_only_other").cast(pl.Int64).max())
        .sort("probe_set")
    )


def render_comparison_page(
    store: Store, frame: pl.DataFrame, base: tuple[str, str], other: tuple[str, str],
    alerts: list[str] | None = None,
) -> str:
    """Write the page of ``frame`` (:func:`pipeline.analysis.paired.paired_comparison` of ``other`` against
    ``base``); ``alerts`` are shown when it is a release comparison. Returns the page's URL."""
    rows = [
        {
            "analysis": r["analysis"], "probe_set": r["probe_set"], "property": r["property"] or "-",
            "statistic": r["statistic"], "base": fmt(r["base_value"]), "other": fmt(r["value"]),
            "difference [paired 95% CI]": fmt(r["difference"], r["ci_low"], r["ci_high"]),
            "n shared": int(r["n_shared"] or 0), "verdict": r["verdict"],
        }
        for r in frame.iter_rows(named=True)
    ]
    resamples = int(frame["n_resamples"].max()) if frame.height and "n_resamples" in frame.columns else 0
    page = render(
        "comparison.html.j2",
        title=f"normaudit {side_label(other)} vs {side_label(base)}",
        base=side_label(base), other=side_label(other), resamples=resamples,
        differs=sum(r["verdict"] == "differs" for r in rows), n_rows=len(rows),
        units=table(only_one_side(frame)), results=table(rows, COLUMNS), alerts=alerts,
    )
    path = comparison_path(base, other)
    store.write_bytes_atomic(path, page.encode())
    return store.url(path)
