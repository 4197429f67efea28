"""Paired bootstrap of the unit-level analyses: hypernym_pairs, retrieval_calibration, token_norm_vs_frequency.

Each analysis's shared units (pairs, queries, matched words) are written once per side into a temporary
table with their 0-based position among their probe set's shared units ordered by key; the statistics are
then computed in ``sql/paired_<analysis>.sql`` on weighted resamples read from ``paired_weights``
(``sql/paired_weights.sql``: the audit bootstrap's weights), one batch of replicates at a time, and on the
unweighted units for the point values.
"""

from __future__ import annotations

import duckdb


def side_params(base: tuple[str, str], other: tuple[str, str]) -> dict[str, str]:
    """The SQL parameters naming both sides of a comparison."""
    return {"base_model": base[0], "base_release": base[1], "other_model": other[0], "other_release": other[1]}


def sides(base: tuple[str, str], other: tuple[str, str]) -> list[tuple[int, tuple[str, str]]]:
    """(side number, (model, release)) to compute; a side compared with itself is computed once and copied
    (:func:`mirror_self`), so its differences are exactly 0 whatever the order of parallel float sums."""
    return [(0, base)] if base == other else [(0, base), (1, other)]


def mirror_self(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str],
                analysis: str) -> None:
    """Where base is other, copy side 0's rows of ``analysis`` to side 1."""
    if base != other:
        return
    for table in ("paired_points", "paired_replicates"):
        con.execute(f"insert into {table} select * replace (1::utinyint as side) from {table} "
                    "where side = 0 and analysis = $a", {"a": analysis})


def compare_units(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str], bound: dict,
                  shared: bool) -> None:
    """Fill the paired inputs of the unit-level analyses (``shared``: the part that runs while
    ``embeddings`` shows the shared items only, i.e. the retrieval search)."""
