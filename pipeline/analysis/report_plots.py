"""The report's plots of norm against a property, drawn in bounded memory at any number of items.

A probe set of up to :data:`POINTS_MAX` items is drawn from its items (``sql/report_points.sql``); a larger one
from their counts on a :data:`DENSITY_CELLS` x :data:`DENSITY_CELLS` grid (``sql/report_density.sql`` over the
range of ``sql/report_extents.sql``), each
count placed at its cell's centre and summed into the plot's hexagons, so the report's worker holds a few
hundred thousand numbers per plot, never every item (10 M items held 8 GiB). Box plots of the norm per level
(WordNet depth) are drawn from quartiles and whiskers DuckDB computes over every item
(``sql/report_box_stats.sql``): the same numbers matplotlib's ``boxplot`` computes from the items.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from pipeline.analysis import plots
from pipeline.analysis.sql import run_query
from pipeline.storage.store import Store

# Properties plotted against the norm when a probe set has them (WordNet depth gets box plots).
SCATTER_PROPERTIES = ("zipf", "rating_sd", "label_entropy")
BOX_PROPERTY = "min_depth"
# Above this many items a density plot is drawn from grid counts instead of the items themselves.
POINTS_MAX = 100_000
# Grid cells per axis of those counts: ~11 per hexagon across at the plots' 45 hexagons, so a count lands in
# its items' hexagon but for cells straddling a hexagon's edge.
DENSITY_CELLS = 512


@dataclass
class Plot:
    """A PNG written beside the page, with its caption."""

    file: str
    caption: str


def pick(results: pl.DataFrame, analysis: str, probe_set: str, prop: str, statistic: str) -> dict | None:
    """The ``results`` row of one statistic, if there is one."""
    rows = results.filter(
        (pl.col("analysis") == analysis)
        & (pl.col("probe_set") == probe_set)
        & (pl.col("property") == prop)
        & (pl.col("statistic") == statistic)
    )
    return rows.row(0, named=True) if rows.height else None


def _rho(
    results: pl.DataFrame, probe_set: str, prop: str, statistic: str = "spearman", label: str = "ρ"
) -> str:
    row = pick(results, "norm_vs_property", probe_set, prop, statistic)
    if row is None:
        return ""
    ci = "" if row["ci_low"] is None else f" [{row['ci_low']:+.2f}, {row['ci_high']:+.2f}]"
    return f"{label} = {row['value']:+.3f}{ci}"


def _bin_medians(results: pl.DataFrame, probe_set: str, prop: str) -> tuple[np.ndarray, np.ndarray]:
    rows = results.filter(
        (pl.col("analysis") == "norm_by_bin")
        & (pl.col("probe_set") == probe_set)
        & (pl.col("property") == prop)
    )
    stats = {r["statistic"]: r["value"] for r in rows.iter_rows(named=True)}
    bins = sorted({int(s[3:5]) for s in stats})
    x = [(stats[f"bin{b:02d}_low"] + stats[f"bin{b:02d}_high"]) / 2 for b in bins]
    return np.asarray(x), np.asarray([stats[f"bin{b:02d}_median"] for b in bins])


def _title(results: pl.DataFrame, probe_set: str, prop: str, n: int) -> str:
    stats = "; ".join(s for s in (_rho(results, probe_set, prop),
                                  _rho(results, probe_set, prop, "partial_spearman_zipf", "partial ρ | zipf")) if s)
    return f"{probe_set}: norm vs {prop} (n = {n:,} items)" + (f"\n{stats}" if stats else "")


def property_plots(con: duckdb.DuckDBPyConnection, store: Store, folder: str, model: str, release: str,
                   results: pl.DataFrame, points_max: int = POINTS_MAX,
                   inventory: pl.DataFrame | None = None) -> list[Plot]:
    """Write a plot of norm against each property of :data:`SCATTER_PROPERTIES` and :data:`BOX_PROPERTY` per probe
    set that has it into ``folder``; returns them in that order. Sets of more than ``points_max`` items are
    drawn from grid counts, over the range of each probe set's norms in ``inventory`` (the release's
    ``report_inventory`` rows; read here when not given)."""
    out = []
    params = {"model": model, "release": release}
    if inventory is None:
        inventory = run_query(con, "report_inventory", **params)
    norms = inventory.select("probe_set", y0="min_norm", y1="max_norm")
    extents = (run_query(con, "report_extents", properties=list(SCATTER_PROPERTIES))
               .join(norms, on="probe_set").sort("probe_set", "property"))
    for prop in SCATTER_PROPERTIES:
        for extent in extents.filter(pl.col("property") == prop).drop("property").iter_rows(named=True):
            probe_set = extent.pop("probe_set")
            cells = run_query(con, "report_density", **params, property=prop, probe_set=probe_set,
                              cells=DENSITY_CELLS, **extent)
            n = int(cells["items"].sum())
            if n == 0:
                continue
            caption = ("Colour: items per hexagon; red: median norm within bins of the property (norm_by_bin); "
                       "ρ: Spearman with a 95% bootstrap interval.")
            if n <= points_max:
                points = run_query(con, "report_points", **params, property=prop, probe_set=probe_set)
                x, y, weights = points["value"].to_numpy(), points["norm"].to_numpy(), None
            else:
                x, y, weights = cells["x"].to_numpy(), cells["y"].to_numpy(), cells["items"].to_numpy()
                caption += (f" The {n:,} items were counted on a {DENSITY_CELLS} × {DENSITY_CELLS} grid first, "
                            "each count drawn at its cell's centre.")
            png = plots.hexbin(x, y, plots.property_label(prop), _title(results, probe_set, prop, n),
                               _bin_medians(results, probe_set, prop), "median norm per bin", weights=weights)
            out.append(_write(store, folder, f"norm_vs_{prop}_{probe_set}.png", png, caption))
    boxes = run_query(con, "report_box_stats", **params, property=BOX_PROPERTY)
    for (probe_set,), levels in boxes.group_by(["probe_set"], maintain_order=True):
        png = plots.boxes(levels.select("level", "n", "whislo", "q1", "med", "q3", "whishi").rows(named=True),
                          plots.property_label(BOX_PROPERTY),
                          _title(results, probe_set, BOX_PROPERTY, int(levels["n"].sum())))
        caption = ("Box: quartiles of the norm at each depth, whiskers 1.5 IQR, outliers hidden; "
                   "ρ is Spearman's rank correlation with a 95% bootstrap interval.")
        out.append(_write(store, folder, f"norm_vs_{BOX_PROPERTY}_{probe_set}.png", png, caption))
    return out


def _write(store: Store, folder: str, name: str, png: bytes, caption: str) -> Plot:
    store.write_bytes_atomic(f"{folder}/{name}", png)
    return Plot(name, caption)
