"""The claims table: what the audited model's norms say about each claim of the paper behind normaudit.

The paper claims that the norms of contrastive embeddings carry **specificity** (more specific concepts get
longer vectors), **frequency** (frequent words shorter ones), **human uncertainty** (items people disagree
on, shorter ones) and give **free calibration in retrieval** (a query's norm predicts whether it is answered,
beyond the retriever's own top-1 cosine). Each claim is decided by the tests of :data:`CLAIM_TESTS`, written
down before any data was looked at; a test whose probe set the audit lacks is left out.

Rule (docs/analyses.md, "The claims table"):
- every test has a statistic T, its null value (0 for a correlation or a difference, 0.5 for an AUROC or a
  share) and the claimed direction; its p-value is the two-sided bootstrap p of the null (twice the smaller
  share of replicates on either side of it; hypernym shares: the normal approximation of the binomial);
- within a claim the p-values are adjusted by Holm's step-down method (family: the claim's tests present);
- a test **supports** the claim when its adjusted p < 0.05 and T lies on the claimed side of the null,
  **contradicts** it when adjusted p < 0.05 on the other side, and gives **no evidence** otherwise;
- the claim is **supported** when at least one test supports it and none contradicts, **contradicted** when
  one contradicts and none supports, **mixed** when both happen, and **no evidence** otherwise.

The correlations are partial Spearman correlations of norm and the property given the controls named
(frequency, token count, mean rating), computed on every item with the property and the controls
(:func:`pipeline.analysis.unit_bootstrap.partial_rank_correlation`), with the audit's seeded Poisson
bootstrap over the items (position = the item's among the test's items ordered by id). The population each
verdict holds for is named: the probe set, the items counted and, where the release embedded only part of
the set (``--limit``), that it was the first N in the set's stable order (for WordNet nouns, the most
frequent).
"""

from __future__ import annotations

import hashlib
import math
from typing import Literal

import duckdb
import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict

from pipeline.analysis.analyses import RESULT_COLUMNS, run_analysis
from pipeline.analysis.retrieval_intervals import REPLICATES
from pipeline.analysis.sql import DEFAULT_PARAMS, ensure_staged, run_query
from pipeline.analysis.unit_bootstrap import (
    POISSON,
    bootstrap_p,
    interval,
    partial_rank_correlation,
    replicate_chunks,
    weighted_mean,
)
from pipeline.storage.runs import write_claims
from pipeline.storage.store import Store

ALPHA = 0.05
CLAIMS = ("specificity", "frequency", "human_uncertainty", "retrieval_calibration")
# the stable order --limit takes the first items in, where a set's order means something
SET_ORDERS = {"wordnet-nouns": "most frequent first", "wordnet-pairs": "most frequent first"}
CLAIM_COLUMNS = {
    "run_id": pl.String, "model": pl.String, "release": pl.String, "claim": pl.String, "verdict": pl.String,
    "probe_set": pl.String, "population": pl.String, "analysis": pl.String, "property": pl.String,
    "statistic": pl.String, "controls": pl.String, "direction": pl.String, "null_value": pl.Float64,
    "value": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "n": pl.Int64, "n_resamples": pl.Int64,
    "ci_method": pl.String, "p_value": pl.Float64, "p_holm": pl.Float64, "evidence": pl.String,
}


class ClaimTest(BaseModel):
    """One test of a claim: a statistic, its null value and the side the claim predicts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim: Literal["specificity", "frequency", "human_uncertainty", "retrieval_calibration"]
    probe_set: str
    property: str
    statistic: str
    direction: Literal[1, -1]
    null_value: float = 0.0
    # where T comes from: "controlled" = computed here (partial Spearman of norm and property given
    # ``controls``); otherwise the audit analysis whose stored row and replicates it is
    source: Literal["controlled", "retrieval_calibration", "retrieval_signals", "hypernym_pairs"] = "controlled"
    controls: tuple[str, ...] = ()
    kind: str = ""  # only items of this kind ('' = all)


def _controlled(claim: str, probe_set: str, prop: str, direction: int, controls: tuple[str, ...],
                kind: str = "") -> ClaimTest:
    statistic = "partial_spearman_" + "_".join(controls) if controls else "spearman"
    return ClaimTest(claim=claim, probe_set=probe_set, property=prop, statistic=statistic, direction=direction,
                     controls=controls, kind=kind)


# Written down before looking (issue 34). Specificity: deeper in WordNet, fewer senses, fewer hyponyms = more
# specific; frequency and length controlled. Frequency: length controlled. Human uncertainty: ChaosNLI pairs'
# label entropy given length; concreteness ratings' spread given their mean, frequency and length.
CLAIM_TESTS: tuple[ClaimTest, ...] = (
    _controlled("specificity", "wordnet-nouns", "min_depth", 1, ("zipf", "n_tokens")),
    _controlled("specificity", "wordnet-nouns", "n_senses", -1, ("zipf", "n_tokens")),
    _controlled("specificity", "wordnet-nouns", "n_all_hyponyms", -1, ("zipf", "n_tokens")),
    ClaimTest(claim="specificity", probe_set="wordnet-pairs", property="hypernym_of",
              statistic="share_hyponym_norm_greater_zipf_matched", direction=1, null_value=0.5,
              source="hypernym_pairs"),
    _controlled("frequency", "wordnet-nouns", "zipf", -1, ("n_tokens",)),
    _controlled("frequency", "brysbaert-concreteness", "zipf", -1, ("n_tokens",)),
    _controlled("human_uncertainty", "chaosnli-snli", "label_entropy", -1, ("n_tokens",), kind="pair"),
    _controlled("human_uncertainty", "chaosnli-mnli", "label_entropy", -1, ("n_tokens",), kind="pair"),
    _controlled("human_uncertainty", "brysbaert-concreteness", "rating_sd", -1, ("rating_mean", "zipf", "n_tokens")),
    *(ClaimTest(claim="retrieval_calibration", probe_set=s, property="success_at_1", statistic=stat,
                direction=1, null_value=null, source=source)
      for s in ("cranfield", "wordnet-reverse-dictionary")
      for source, stat, null in (("retrieval_calibration", "auroc_query_norm", 0.5),
                                 ("retrieval_signals", "cv_auroc_gain_query_norm", 0.0))),
)


# the audit analyses whose stored rows a test reads, in the order they must run
TEST_SOURCES = ("hypernym_pairs", "retrieval_calibration", "retrieval_signals")


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (NaN stays NaN and is not counted)."""
    finite = [(p, i) for i, p in enumerate(p_values) if not math.isnan(p)]
    m, out, running = len(finite), [float("nan")] * len(p_values), 0.0
    for rank, (p, i) in enumerate(sorted(finite)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def evidence(value: float, null: float, direction: int, p_holm: float) -> str:
    """'supports', 'contradicts' or 'none' for one test (the module's rule)."""
    if math.isnan(p_holm) or p_holm >= ALPHA or value == null:
        return "none"
    return "supports" if (value - null) * direction > 0 else "contradicts"


def verdict(evidences: list[str]) -> str:
    """A claim's verdict from its tests' evidence."""
    up, down = "supports" in evidences, "contradicts" in evidences
    return "mixed" if up and down else "supported" if up else "contradicted" if down else "no evidence"


def _wilson_p(share: float, n: int, null: float) -> float:
    """Two-sided p of a share against ``null`` by the normal approximation of the binomial."""
    if n <= 0:
        return float("nan")
    z = (share - null) / math.sqrt(null * (1 - null) / n)
    return math.erfc(abs(z) / math.sqrt(2))


def _population(probe_set: str, n: int, unit: str, coverage: dict[str, tuple[int, int]]) -> str:
    total, embedded = coverage.get(probe_set, (0, 0))
    text = f"{probe_set}: {n:,} {unit}"
    if embedded < total:
        order = SET_ORDERS.get(probe_set, "the set's stable order")
        text += f" (of the first {embedded:,} of {total:,} items, {order}: --limit)"
    return text


class TestResult(BaseModel):
    """One test's value, its bootstrap replicates and the units they resample, for one release."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    value: float
    ci_low: float | None
    ci_high: float | None
    n: int
    n_resamples: int | None
    ci_method: str | None
    p_value: float
    unit: str  # what n counts
    units: str  # digest of the unit ids in resampling order: two releases pair only over the same units
    replicates: np.ndarray


def _digest(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def _controlled(con: duckdb.DuckDBPyConnection, test: ClaimTest, model: str, release: str, seed: int,
                resamples: int) -> TestResult | None:
    long = run_query(con, "claims_items", model=model, release=release, probe_set=test.probe_set, kind=test.kind)
    if not long.height:
        return None
    needed = [test.property, *(c for c in test.controls if c != "n_tokens")]
    wide = long.filter(pl.col("property").is_in(needed)).pivot(
        on="property", index=["item_id", "norm", "n_tokens"], values="value", aggregate_function="first")
    if any(c not in wide.columns for c in needed):
        return None
    wide = wide.drop_nulls(needed).sort("item_id")
    columns = [wide["norm"].to_numpy().astype(np.float64), wide[test.property].to_numpy().astype(np.float64)]
    # a control that does not vary (every word one token) controls nothing and makes the system singular
    for control in test.controls:
        values = wide[control].to_numpy().astype(np.float64)
        if len(values) and values.min() < values.max():
            columns.append(values)
    n = wide.height
    if n < 4 or columns[1].min() == columns[1].max():
        return None
    value = float(partial_rank_correlation(columns, np.ones((1, n)))[0])
    reps = np.concatenate([partial_rank_correlation(columns, w) for _, w in replicate_chunks(seed, resamples, n)])
    low, high, kept = interval(reps)
    unit = f"{test.kind}s" if test.kind else "items"
    return TestResult(value=value, ci_low=low, ci_high=high, n=n, n_resamples=kept, ci_method=POISSON,
                      p_value=bootstrap_p(reps, test.null_value), unit=f"{unit} with {test.property}",
                      units=_digest(wide["item_id"].to_list()), replicates=reps)


def _hypernym(con: duckdb.DuckDBPyConnection, test: ClaimTest, row: dict, model: str, release: str, seed: int,
              resamples: int) -> TestResult:
    # the stored share and its Wilson interval decide the claim; the pairs' bootstrap serves paired differences
    pairs = run_query(con, "claims_pairs", model=model, release=release, probe_set=test.probe_set,
                      zipf_tolerance=DEFAULT_PARAMS["zipf_tolerance"])
    greater = pairs["hyponym_greater"].to_numpy().astype(np.float64)
    reps = np.concatenate([weighted_mean(greater, w) for _, w in replicate_chunks(seed, resamples, len(greater))]) \
        if len(greater) else np.zeros(0)
    ids = [f"{a}>{b}" for a, b in zip(pairs["hypernym_id"], pairs["hyponym_id"], strict=True)]
    return TestResult(value=row["value"], ci_low=row["ci_low"], ci_high=row["ci_high"], n=row["n"],
                      n_resamples=row["n_resamples"], ci_method=row["ci_method"],
                      p_value=_wilson_p(row["value"], row["n"], test.null_value), unit="frequency-matched pairs",
                      units=_digest(ids), replicates=reps)


def _retrieval(con: duckdb.DuckDBPyConnection, test: ClaimTest, row: dict) -> TestResult:
    reps = _unit_replicates(con, test)
    ids = con.execute("select query_id from retrieval_queries where alpha = 0 and probe_set = $p order by query_id",
                      {"p": test.probe_set}).fetchnumpy()["query_id"].tolist()
    return TestResult(value=row["value"], ci_low=row["ci_low"], ci_high=row["ci_high"], n=row["n"],
                      n_resamples=row["n_resamples"], ci_method=row["ci_method"],
                      p_value=bootstrap_p(reps, test.null_value), unit="queries", units=_digest(ids),
                      replicates=reps)


def _unit_replicates(con: duckdb.DuckDBPyConnection, test: ClaimTest) -> np.ndarray:
    exists = con.execute("select count(*) from duckdb_tables() where table_name = $t and temporary",
                         {"t": REPLICATES}).fetchall()[0][0]
    if not exists:
        return np.zeros(0)
    return con.execute(
        f"select value from {REPLICATES} where analysis = $a and probe_set = $p and property = $q "
        "and statistic = $s order by b",
        {"a": test.source, "p": test.probe_set, "q": test.property, "s": test.statistic}).fetchnumpy()["value"]


def run_tests(con: duckdb.DuckDBPyConnection, results: pl.DataFrame, model: str, release: str, seed: int,
              resamples: int) -> list[tuple[ClaimTest, TestResult]]:
    """Every test of :data:`CLAIM_TESTS` the release's probe sets allow, with its result.

    Args:
        con: a catalog connection on which the release's retrieval analyses ran last (their replicates are
            read from it), e.g. the audit's.
        results: the release's ``results`` rows (hypernym shares, retrieval statistics).
    """
    ensure_staged(con, "stg_release_sets", model, release)  # the release's probe sets, read once per connection
    embedded = set(con.execute("select probe_set from stg_release_sets").fetchnumpy()["probe_set"].tolist())
    out = []
    for test in CLAIM_TESTS:
        if test.probe_set not in embedded:
            continue
        if test.source == "controlled":
            got = _controlled(con, test, model, release, seed, resamples)
        else:
            match = results.filter((pl.col("analysis") == test.source) & (pl.col("probe_set") == test.probe_set)
                                   & (pl.col("property") == test.property)
                                   & (pl.col("statistic") == test.statistic))
            if not match.height or match["value"][0] is None:
                continue
            row = match.row(0, named=True)
            got = (_hypernym(con, test, row, model, release, seed, resamples) if test.source == "hypernym_pairs"
                   else _retrieval(con, test, row))
        if got is not None:
            out.append((test, got))
    return out


def _base(test: ClaimTest) -> dict:
    return {"claim": test.claim, "probe_set": test.probe_set, "property": test.property,
            "statistic": test.statistic, "controls": ", ".join(test.controls) or None,
            "direction": "+" if test.direction > 0 else "-", "null_value": test.null_value}


def claims_table(con: duckdb.DuckDBPyConnection, results: pl.DataFrame, model: str, release: str, run_id: str,
                 seed: int = DEFAULT_PARAMS["seed"], resamples: int = DEFAULT_PARAMS["resamples"]) -> pl.DataFrame:
    """The claims table of one audit (columns :data:`CLAIM_COLUMNS`): one row per test its probe sets allow,
    with the verdict of its claim (:func:`run_tests` says what ``con`` and ``results`` must hold)."""
    coverage = {r["probe_set"]: (r["n_items"], r["n_embedded"])
                for r in run_query(con, "claims_coverage", model=model, release=release).iter_rows(named=True)}
    rows = [{**_base(test), "analysis": "claims" if test.source == "controlled" else test.source,
             **got.model_dump(include={"value", "ci_low", "ci_high", "n", "n_resamples", "ci_method", "p_value"}),
             "population": _population(test.probe_set, got.n, got.unit, coverage)}
            for test, got in run_tests(con, results, model, release, seed, resamples)]
    frame = pl.DataFrame(rows, schema={c: t for c, t in CLAIM_COLUMNS.items()
                                       if c not in ("run_id", "model", "release", "verdict", "p_holm", "evidence")})
    out = []
    for claim in CLAIMS:
        part = frame.filter(pl.col("claim") == claim)
        if not part.height:
            continue
        adjusted = holm(part["p_value"].fill_null(float("nan")).to_list())
        marks = [evidence(v, null, 1 if d == "+" else -1, p) for v, null, d, p in
                 zip(part["value"], part["null_value"], part["direction"], adjusted, strict=True)]
        out.append(part.with_columns(pl.Series("p_holm", adjusted, dtype=pl.Float64),
                                     pl.Series("evidence", marks, dtype=pl.String),
                                     pl.lit(verdict(marks)).alias("verdict")))
    if not out:
        return pl.DataFrame(schema=CLAIM_COLUMNS)
    return pl.concat(out).with_columns(
        pl.lit(run_id).alias("run_id"), pl.lit(model).alias("model"), pl.lit(release).alias("release"),
    ).select(list(CLAIM_COLUMNS)).cast(CLAIM_COLUMNS)


PAIRED_CLAIM_COLUMNS = {
    "claim": pl.String, "probe_set": pl.String, "property": pl.String, "statistic": pl.String,
    "controls": pl.String, "base_model": pl.String, "base_release": pl.String, "model": pl.String,
    "release": pl.String, "base_value": pl.Float64, "value": pl.Float64, "difference": pl.Float64,
    "ci_low": pl.Float64, "ci_high": pl.Float64, "n": pl.Int64, "n_resamples": pl.Int64,
}


def paired_claims(con: duckdb.DuckDBPyConnection, base: tuple[str, str], other: tuple[str, str], seed: int,
                  resamples: int) -> pl.DataFrame:
    """Each claim test on two releases (other - base), with a paired 95% bootstrap interval of the difference.

    Both sides resample their units with the same seeded Poisson weights (a unit's weight hashes its position
    among the test's units ordered by id), so replicate b resamples the same units on both sides where they
    share the same units; a test whose units differ between the sides (e.g. a --limit audit on one side) is
    left out. The difference's interval is the percentile interval of the replicate differences (both
    defined). Runs every analysis the tests need on ``con`` for each side, one side after the other.
    """
    sides = []
    for model, release in (base, other):
        # only the analyses whose rows a test reads (the controlled tests compute their own statistics)
        results = pl.concat([r for name in TEST_SOURCES if (r := run_analysis(
            con, name, model, release, "paired-claims", seed=seed, resamples=resamples)).height] or
            [pl.DataFrame(schema=dict.fromkeys(RESULT_COLUMNS, pl.String))], how="diagonal_relaxed")
        sides.append({(t.claim, t.probe_set, t.property, t.statistic): (t, got)
                      for t, got in run_tests(con, results, model, release, seed, resamples)})
    rows = []
    for key, (test, a) in sides[0].items():
        b = sides[1][key][1] if key in sides[1] else None
        if b is None or b.units != a.units or len(a.replicates) != len(b.replicates):
            continue
        low, high, kept = interval(b.replicates - a.replicates)
        rows.append({"claim": test.claim, "probe_set": test.probe_set, "property": test.property,
                     "statistic": test.statistic, "controls": ", ".join(test.controls) or None,
                     "base_model": base[0], "base_release": base[1], "model": other[0], "release": other[1],
                     "base_value": a.value, "value": b.value, "difference": b.value - a.value, "ci_low": low,
                     "ci_high": high, "n": a.n, "n_resamples": kept})
    return pl.DataFrame(rows, schema=PAIRED_CLAIM_COLUMNS)


def p_text(p: float | None, n_resamples: int | None) -> str:
    """A Holm-adjusted p for people: a bootstrap p of 0 is below its resolution, 2 / replicates."""
    if p is None:
        return "—"
    if p == 0 and n_resamples:
        return f"< {2 / n_resamples:.2g}"
    return f"{p:.3g}"


def store_claims(store: Store, claims: pl.DataFrame) -> None:
    """Write an audit's claims table (``claims/<run_id>.parquet``); nothing when it has no row."""
    if claims.height:
        write_claims(store, claims["run_id"][0], claims)


def test_text(row: dict) -> str:
    """``ρ(norm, min_depth | zipf, n_tokens)`` for a partial correlation, else the statistic's name."""
    if row["statistic"].startswith(("partial_spearman", "spearman")):
        given = f" | {row['controls']}" if row["controls"] else ""
        return f"ρ(norm, {row['property']}{given})"
    return f"{row['statistic']} ({row['property']})"


def read_claims(store: Store, run_id: str) -> pl.DataFrame:
    """The claims table an audit stored (empty when its probe sets spoke to no claim)."""
    rel = f"claims/{run_id}.parquet"
    if not store.exists(rel):
        return pl.DataFrame(schema=CLAIM_COLUMNS)
    return pl.from_arrow(store.read_table(rel))


def limit_note(limit: int | None) -> str | None:
    """The line that says what a ``--limit`` audit's statistics describe, or None without a limit."""
    if limit is None:
        return None
    return (f"sample: --limit {limit:,} took the first {limit:,} items of each probe set in its stable order "
            "(WordNet nouns and pairs: the most frequent first); every statistic describes that sample, not the "
            "whole set (docs/analyses.md, 'Samples')")
