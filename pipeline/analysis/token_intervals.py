"""Bootstrap intervals of token_norm_vs_frequency: its matched tokens resampled.

The units are the tokens ``stg_token_words`` matches to a probe set's words, token number ``pos`` being its
position among them ordered by token id; replicate b weights them with the Poisson bootstrap of
:mod:`pipeline.analysis.unit_bootstrap` and computes both statistics of ``sql/token_norm_vs_frequency.sql``
on the resample: ``spearman`` (token norm vs zipf, average ranks) and ``pearson_log_norm`` (ln norm vs zipf).
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

from pipeline.analysis.unit_bootstrap import (
    POISSON,
    interval,
    partial_rank_correlation,
    replicate_chunks,
    weighted_pearson,
)

INTERVAL_COLUMNS = {"probe_set": pl.String, "property": pl.String, "statistic": pl.String,
                    "ci_low": pl.Float64, "ci_high": pl.Float64, "n_resamples": pl.Int64, "ci_method": pl.String}


def token_intervals(con: duckdb.DuckDBPyConnection, seed: int, resamples: int) -> pl.DataFrame:
    """Intervals (columns :data:`INTERVAL_COLUMNS`) of each probe set's ``zipf`` statistics, from the
    ``stg_token_words`` staged on ``con`` (token_norm_vs_frequency.sql stages it)."""
    frame = con.sql("select probe_set, token_id, norm, zipf from stg_token_words "
                        "order by probe_set, token_id").pl()
    rows = []
    for (probe_set,), part in frame.group_by(["probe_set"], maintain_order=True):
        norm, zipf = part["norm"].to_numpy().astype(np.float64), part["zipf"].to_numpy().astype(np.float64)
        reps = {"spearman": [], "pearson_log_norm": []}
        for _, w in replicate_chunks(seed, resamples, len(norm)):
            reps["spearman"].append(partial_rank_correlation([norm, zipf], w))
            reps["pearson_log_norm"].append(weighted_pearson(np.log(norm), zipf, w))
        for statistic, values in reps.items():
            low, high, kept = interval(np.concatenate(values))
            rows.append((probe_set, "zipf", statistic, low, high, kept, POISSON))
    return pl.DataFrame(rows, schema=INTERVAL_COLUMNS, orient="row")
