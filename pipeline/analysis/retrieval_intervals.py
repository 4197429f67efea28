"""Query-level bootstrap intervals of the retrieval statistics, and the confidence signals compared.

Reads ``retrieval_queries`` (the per-query rows of ``sql/retrieval_per_query.sql``, registered by the
retrieval search) at alpha = 0 and, per retrieval set, resamples its queries with the Poisson bootstrap of
:mod:`pipeline.analysis.unit_bootstrap` (query ``pos`` = its position among the set's scored queries ordered
by id). Every replicate computes, on the same resample:

- ``retrieval_calibration``'s AUROCs (query norm, top-1 cosine, top-1 margin, query length; for success@1
  and success@10), its selective-accuracy points (coverage 0.1 .. 1.0) and their mean: the intervals of
  those rows, which the SQL leaves empty;
- ``retrieval_signals``: the paired differences ``auroc_query_norm_minus_top1_cosine`` and
  ``auroc_query_norm_minus_top1_margin``, and whether the norm **adds** to cosine:
  ``cv_auroc_top1_cosine`` and ``cv_auroc_top1_cosine_and_query_norm``, the cross-validated AUROCs of
  logistic models of success on cosine alone and on cosine and the query norm
  (:mod:`pipeline.analysis.signal_models`), and ``cv_auroc_gain_query_norm``, their difference. The models
  are fitted once on the full sample (held-out scores per fold); the replicates resample the queries those
  scores are evaluated on, not the fits. The norm adds to cosine where the gain's interval lies above 0.

A replicate without both outcomes leaves the AUROCs undefined (NaN); they are dropped, and ``n_resamples``
says how many replicates remained. Every replicate value is also kept, for the claims table, in the
temporary table :data:`REPLICATES` (analysis, probe_set, property, statistic, b, value).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np
import polars as pl

from pipeline.analysis.replicates import insert_replicates
from pipeline.analysis.signal_models import MIN_PER_OUTCOME, fold_of, out_of_fold_scores
from pipeline.analysis.unit_bootstrap import (
    COVERAGE_TENTHS,
    POISSON,
    AurocOrder,
    SelectiveOrder,
    interval,
    replicate_chunks,
)

REPLICATES = "stg_unit_replicates"
REPLICATES_SCHEMA = "analysis varchar, probe_set varchar, property varchar, statistic varchar, b bigint, value double"
SIGNALS = ("query_norm", "top1_cosine", "top1_margin", "query_n_tokens")
SELECTIVE_SIGNALS = ("query_norm", "top1_cosine")
TARGETS = ("success_at_1", "success_at_10")
INTERVAL_COLUMNS = {"probe_set": pl.String, "property": pl.String, "statistic": pl.String,
                    "ci_low": pl.Float64, "ci_high": pl.Float64, "n_resamples": pl.Int64, "ci_method": pl.String}
SIGNAL_COLUMNS = {"probe_set": pl.String, "property": pl.String, "statistic": pl.String, "value": pl.Float64,
                  "ci_low": pl.Float64, "ci_high": pl.Float64, "n": pl.Int64, "n_resamples": pl.Int64,
                  "ci_method": pl.String}


class QuerySet:
    """One retrieval set's scored queries, in id order, and the fixed orders every replicate reuses."""

    def __init__(self, probe_set: str, columns: dict[str, np.ndarray], seed: int) -> None:
        self.probe_set = probe_set
        self.n = len(columns["query_id"])
        self.score = {
            "query_norm": columns["query_norm"].astype(np.float64),
            "top1_cosine": columns["top1_score"].astype(np.float64),
            "top1_margin": columns["margin"].astype(np.float64),
            "query_n_tokens": columns["query_n_tokens"].astype(np.float64),
        }
        self.success = {t: columns[t].astype(np.float64) for t in TARGETS}
        self.auroc_orders = {s: AurocOrder(v) for s, v in self.score.items()}
        self.selective_orders = {s: SelectiveOrder(self.score[s]) for s in SELECTIVE_SIGNALS}
        # held-out scores of the two logistic models, per target with enough of each outcome
        self.cv_orders: dict[str, dict[str, AurocOrder]] = {}
        folds = fold_of(seed, self.n)
        cosine, norm = self.score["top1_cosine"], self.score["query_norm"]
        for target, y in self.success.items():
            if min(y.sum(), self.n - y.sum()) < MIN_PER_OUTCOME:
                continue
            self.cv_orders[target] = {
                "cv_auroc_top1_cosine": AurocOrder(out_of_fold_scores(cosine[:, None], y, folds)),
                "cv_auroc_top1_cosine_and_query_norm": AurocOrder(
                    out_of_fold_scores(np.column_stack([cosine, norm]), y, folds)),
            }

    def statistics(self, w: np.ndarray) -> list[tuple[str, str, str, np.ndarray]]:
        """(analysis, property, statistic, value per replicate) for the replicates of weights ``w``."""
        out = []
        auroc = {}
        for signal, order in self.auroc_orders.items():
            for target, value in zip(TARGETS, order.aurocs([self.success[t] for t in TARGETS], w), strict=True):
                auroc[target, signal] = value
        for target, y in self.success.items():
            for signal in self.auroc_orders:
                out.append(("retrieval_calibration", target, f"auroc_{signal}", auroc[target, signal]))
            for other in ("top1_cosine", "top1_margin"):
                out.append(("retrieval_signals", target, f"auroc_query_norm_minus_{other}",
                            auroc[target, "query_norm"] - auroc[target, other]))
            if target in self.cv_orders:
                cv = {name: order.auroc(y, w) for name, order in self.cv_orders[target].items()}
                out += [("retrieval_signals", target, name, value) for name, value in cv.items()]
                out.append(("retrieval_signals", target, "cv_auroc_gain_query_norm",
                            cv["cv_auroc_top1_cosine_and_query_norm"] - cv["cv_auroc_top1_cosine"]))
        for signal, order in self.selective_orders.items():
            curve = order.curve(self.success["success_at_1"], w)
            prop = f"selective_accuracy_{signal}"
            out += [("retrieval_calibration", prop, f"coverage_{t / 10:.1f}", curve[:, j])
                    for j, t in enumerate(COVERAGE_TENTHS)]
            out.append(("retrieval_calibration", prop, "mean_selective_accuracy", curve.mean(axis=1)))
        return out


def query_sets(con: duckdb.DuckDBPyConnection, seed: int) -> list[QuerySet]:
    """The scored queries of every retrieval set registered on ``con`` (``retrieval_queries``)."""
    frame = con.sql(
        "select probe_set, query_id, query_norm, query_n_tokens, top1_score, margin, success_at_1, success_at_10 "
        "from retrieval_queries where alpha = 0 order by probe_set, query_id").pl()
    sets = []
    for (probe_set,), part in frame.group_by(["probe_set"], maintain_order=True):
        columns = {c: part[c].to_numpy() for c in part.columns if c != "probe_set"}
        columns["margin"] = part["margin"].cast(pl.Float64).fill_null(np.nan).to_numpy()
        sets.append(QuerySet(probe_set, columns, seed))
    return sets


def stage_retrieval_replicates(con: duckdb.DuckDBPyConnection, seed: int, resamples: int,
                               threads: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Bootstrap every retrieval set's queries; keep the replicates in :data:`REPLICATES`.

    Returns:
        ``(intervals, signals)``: the intervals of ``retrieval_calibration``'s rows (columns
        :data:`INTERVAL_COLUMNS`, joined onto the SQL's rows by probe set, property and statistic), and the
        ``retrieval_signals`` rows (:data:`SIGNAL_COLUMNS`), values from the full sample.
    """
    con.execute(f"create or replace temp table {REPLICATES} ({REPLICATES_SCHEMA})")
    intervals, signals = [], []
    for qs in query_sets(con, seed):
        full = {(a, p, s): float(v[0]) for a, p, s, v in qs.statistics(np.ones((1, qs.n)))}
        chunks = list(replicate_chunks(seed, resamples, qs.n))

        def run(chunk: tuple[int, np.ndarray], qs: QuerySet = qs) -> list[tuple[str, str, str, np.ndarray, int]]:
            first, w = chunk
            return [(a, p, s, v, first) for a, p, s, v in qs.statistics(w)]

        # numpy's array operations release the GIL: chunks of replicates run side by side
        with ThreadPoolExecutor(max_workers=threads or min(4, len(os.sched_getaffinity(0)))) as pool:
            parts = [r for rows in pool.map(run, chunks) for r in rows]
        by_name: dict[tuple[str, str, str], list[tuple[int, np.ndarray]]] = {}
        for a, p, s, v, first in parts:
            by_name.setdefault((a, p, s), []).append((first, v))
        kept_rows = []
        for name, pieces in by_name.items():
            reps = np.concatenate([v for _, v in sorted(pieces, key=lambda x: x[0])])
            analysis, prop, statistic = name
            low, high, kept = interval(reps)
            if analysis == "retrieval_calibration":
                intervals.append((qs.probe_set, prop, statistic, low, high, kept, POISSON))
            elif np.isfinite(full[name]):
                n = qs.n if not statistic.startswith("auroc_query_norm_minus_top1_margin") else \
                    int(np.isfinite(qs.score["top1_margin"]).sum())
                signals.append((qs.probe_set, prop, statistic, full[name], low, high, n, kept, POISSON))
            kept_rows.append(((analysis, qs.probe_set, prop, statistic), reps, np.arange(len(reps), dtype=np.int64)))
        if kept_rows:
            insert_replicates(con, REPLICATES, ("analysis", "probe_set", "property", "statistic", "b", "value"),
                              kept_rows)
    return (pl.DataFrame(intervals, schema=INTERVAL_COLUMNS, orient="row"),
            pl.DataFrame(signals, schema=SIGNAL_COLUMNS, orient="row"))
