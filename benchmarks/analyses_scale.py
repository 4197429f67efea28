"""What the audit's analyses cost at 1 M, 5 M and 10 M items, against what embedding those items costs.

For each ``--sizes`` N, in one process, one size after the other (each on a fresh connection, as an audit's
catalog is made: ``pipeline.storage.catalog.connect``, DuckDB's memory capped at ``--duckdb-memory``):

1. ``benchmarks/analysis_suite.py``'s seeded rows for N words (one probe set; zipf, min_depth, rating_sd:
   3 property rows per item; N/10 hypernym pairs; a 30,000-token table), copied into DuckDB tables named
   as the catalog's views.
2. The audit's analyses as ``pipeline.audit.steps.run_analyses`` runs them (``run_analysis`` for each of
   ``AUDIT_ANALYSES``; the retrieval ones find no retrieval set and return nothing), with the staging of the
   item rows timed apart and norm_vs_property's intervals timed apart from its points.
3. norm_vs_property's intervals as the audit computes them now (``run_query("norm_vs_property_ci")`` at the
   default parameters: 1,000 resamples; samples over ``bootstrap_switch_n`` items by the m-out-of-n bootstrap
   of ``bootstrap_m`` draws a replicate), measured whole.
4. The full Poisson bootstrap at the audit's 1,000 resamples (the route before the switch-over existed, and
   still below it), **extrapolated**: its replicates are staged
   (``pipeline.analysis.bootstrap.stage_replicates``, the production function) at ``--fit-resamples R1 R2``
   replicates (default: 2 and 2 + max(10, 150,000,000 / N), about 10 s of CPU each); the cost is fitted as
   a + b R through the two (a: reading the staged rows and sorting them once; b: one replicate, computed the
   same way for every replicate) and reported at R = 1,000. 1,000 full replicates of 10 M items would take
   about a quarter of an hour of this machine's CPU.

Each figure is printed in wall seconds and CPU seconds of the process (DuckDB's and numpy's threads
included), beside the time to embed N words with MiniLM as measured before (docs/scale.md, "Items per
second per worker"): 89,602 words/s on one H200 (float32, 2026-11-29) and 1,903 words/s on this project's
2-core CPU worker (float32, 2026-11-29).

    python benchmarks/analyses_scale.py [--sizes 1000000 5000000 10000000] [--fit-resamples R1 R2]
                                        [--duckdb-memory 4GB]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from analysis_suite import build, peak_gib, reset_peak  # noqa: E402 - a sibling script, importable once its folder is on the path

from pipeline.analysis.analyses import AUDIT_ANALYSES, run_analysis  # noqa: E402
from pipeline.analysis.replicates import stage_replicates  # noqa: E402
from pipeline.analysis.sql import ANALYSIS_STAGING, BOOTSTRAP, DEFAULT_PARAMS, ensure_staged, run_query  # noqa: E402
from pipeline.storage.catalog import connect  # noqa: E402

# MiniLM words per second, docs/scale.md "Items per second per worker" (benchmarks/embed_throughput.py)
EMBED_RATES = {"one H200": 89_602, "2-core CPU worker": 1_903}
AUDIT_RESAMPLES = DEFAULT_PARAMS["resamples"]


class Clock:
    """Wall and process CPU seconds of a block: ``with clock("name"): ...``; kept in ``self.seconds``."""

    def __init__(self) -> None:
        self.seconds: dict[str, tuple[float, float]] = {}

    def __call__(self, name: str) -> Clock:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._start = (time.perf_counter(), time.process_time())

    def __exit__(self, *exc: object) -> None:
        wall, cpu = time.perf_counter() - self._start[0], time.process_time() - self._start[1]
        self.seconds[self._name] = (wall, cpu)


def load(items: int, memory: str):
    con = connect()
    con.execute(f"set memory_limit = '{memory}'")  # a setting takes a literal, not a parameter
    tables = build(items)
    for name, table in tables.items():
        con.register(f"{name}_arrow", table)
        con.execute(f"create table {name} as select * from {name}_arrow")
        con.unregister(f"{name}_arrow")
    del tables
    gc.collect()
    # the retrieval analyses read vectors (of query and doc items only: there are none here)
    con.execute("alter table embeddings add column vector float[]")
    return con


def measure(items: int, fit: tuple[int, int] | None, memory: str) -> dict[str, tuple[float, float]]:
    fit = fit or (2, 2 + max(10, 150_000_000 // items))
    clock = Clock()
    t = time.perf_counter()
    con = load(items, memory)
    print(f"\n{items:,} items: rows built and loaded in {time.perf_counter() - t:.1f} s", flush=True)
    reset_peak()
    try:
        with clock("staging"):
            for table in ANALYSIS_STAGING:
                ensure_staged(con, table, "m", "r")
        params = {"seed": DEFAULT_PARAMS["seed"], "resamples": AUDIT_RESAMPLES}
        for name in AUDIT_ANALYSES:
            if name == "norm_vs_property":
                with clock(name + " (points)"):  # run_analysis would add the intervals: timed below
                    run_query(con, name, model="m", release="r")
                continue
            with clock(name):
                run_analysis(con, name, "m", "r", "bench", **params)
        # the intervals read only the staged rows: the stored tables go, so that 10 M items fit beside others' work
        for name in ("embeddings", "probe_properties", "probe_items", "probe_relations", "token_norms"):
            con.execute(f"drop table {name}")
        with clock("intervals (the audit's route)"):
            route = run_query(con, "norm_vs_property_ci", model="m", release="r", **params)
        methods = sorted(set(route["ci_method"]))
        value_rows = con.execute("select count(*) from stg_analysis_values").fetchone()[0]
        batch = max(1, DEFAULT_PARAMS["bootstrap_batch_rows"] // value_rows)
        for resamples in fit:
            with clock(f"full bootstrap, {resamples} resamples"):
                stage_replicates(con, BOOTSTRAP, DEFAULT_PARAMS["seed"], resamples, min(batch, resamples))
    finally:
        con.close()
    peak = peak_gib()
    (w1, c1), (w2, c2) = (clock.seconds[f"full bootstrap, {r} resamples"] for r in fit)
    slope_w, slope_c = (w2 - w1) / (fit[1] - fit[0]), (c2 - c1) / (fit[1] - fit[0])
    clock.seconds[f"full bootstrap, {AUDIT_RESAMPLES} resamples (extrapolated)"] = (
        w1 + slope_w * (AUDIT_RESAMPLES - fit[0]), c1 + slope_c * (AUDIT_RESAMPLES - fit[0]))
    for name, (wall, cpu) in clock.seconds.items():
        print(f"  {name:<50} {wall:8.1f} s wall {cpu:8.1f} s CPU", flush=True)
    print(f"  one full replicate: {slope_w:.3f} s wall, {slope_c:.3f} s CPU; peak RSS {peak:.2f} GiB; "
          f"the audit's intervals: {', '.join(methods)}")
    # one m-out-of-n replicate's CPU: the route's time less the reading and sorting both routes do once (the
    # fit's intercept); a Poisson replicate costs in proportion to n, so the two cost the same at about
    route_cpu = clock.seconds["intervals (the audit's route)"][1]
    m_replicate = (route_cpu - (c1 - slope_c * fit[0])) / AUDIT_RESAMPLES
    print(f"  one m-out-of-n replicate: ~{m_replicate:.4f} s CPU, as much as a Poisson replicate of "
          f"~{items * m_replicate / slope_c:,.0f} items")
    return clock.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000, 10_000_000])
    parser.add_argument("--fit-resamples", type=int, nargs=2, default=None,
                        help="the two full-bootstrap counts the cost is fitted through (default: by size)")
    parser.add_argument("--duckdb-memory", default="4GB", help="DuckDB memory_limit (it spills beyond)")
    args = parser.parse_args()
    fit = tuple(sorted(args.fit_resamples)) if args.fit_resamples else None
    summary = {}
    for items in args.sizes:
        summary[items] = measure(items, fit, args.duckdb_memory)
        gc.collect()
    full = f"full bootstrap, {AUDIT_RESAMPLES} resamples (extrapolated)"
    route = "intervals (the audit's route)"
    rates = ", ".join(f"{k} {v:,} words/s" for k, v in EMBED_RATES.items())
    print("\nsummary in CPU seconds (on an idle machine the wall time is at most this; on a shared one it varies); "
          f"MiniLM embedding from docs/scale.md: {rates}; switch-over n={DEFAULT_PARAMS['bootstrap_switch_n']:,}, "
          f"m={DEFAULT_PARAMS['bootstrap_m']:,}")
    for items, seconds in summary.items():
        rest = sum(c for name, (_, c) in seconds.items() if not name.startswith(("full bootstrap", "intervals")))
        embed = {k: items / v for k, v in EMBED_RATES.items()}
        before, after = seconds[full][1], seconds[route][1]
        print(f"  {items:>11,} items: analyses without intervals {rest:6.1f} s; intervals {before:7.1f} s with "
              f"the full bootstrap, {after:6.1f} s now ({before / after:.1f}x less); whole analyses "
              f"{rest + before:7.1f} -> {rest + after:6.1f} s; embedding: " + ", ".join(
                  f"{k} {s:,.0f} s (analyses / embedding {(rest + before) / s:.2f} -> {(rest + after) / s:.2f})"
                  for k, s in embed.items()))


if __name__ == "__main__":
    main()
