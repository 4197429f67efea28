"""The bootstrap replicates of norm_vs_property alone, at scale: seconds and peak memory.

Stages synthetic rows of one probe set straight into DuckDB (``stg_analysis_values`` /
``stg_analysis_groups``, as the audit's staging leaves them; no store, no model): ``--items`` items with a
seeded norm, n_tokens (1..8) and three properties: zipf (two decimals, few distinct values), an integer one
like n_tokens (``n_senses``, 1..30) and a continuous one (``rating``, many values). Then times
``pipeline.analysis.bootstrap.stage_replicates`` for each ``--resamples`` count, in one process, and prints
seconds, seconds per replicate and the process's peak resident memory after each (the peak only grows, so
run the smaller count first).

    python benchmarks/bootstrap_scale.py [--items 1000000] [--resamples 100 1000] [--threads N]
"""

from __future__ import annotations

import argparse
import resource
import time

import duckdb

from pipeline.analysis.replicates import stage_replicates
from pipeline.analysis.sql import BOOTSTRAP, DEFAULT_PARAMS


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def stage_synthetic(con: duckdb.DuckDBPyConnection, items: int) -> int:
    con.execute("create or replace temp table stg_analysis_groups as select hash('scale', property) as group_key, "
                "'scale' as probe_set, property, 1 as set_id, $items as set_items "
                "from (values ('zipf'), ('n_senses'), ('rating')) as t(property)", {"items": items})
    con.execute("""
        create or replace temp table items as
        select i::integer as pos, 3 + random() as norm, (1 + floor(random() * 8))::integer as n_tokens,
            round(1 + 6 * random(), 2) as zipf, 1 + floor(random() * 30) as n_senses, random() as rating
        from range($items) as t(i)""", {"items": items})
    con.execute("""
        create or replace temp table stg_analysis_values as
        with ranked as (select *, (dense_rank() over (order by norm) - 1)::integer as d_norm from items)
        select hash('scale', p.property) as group_key, pos,
            case p.property when 'zipf' then zipf when 'n_senses' then n_senses else rating end as value,
            norm, n_tokens, zipf, d_norm
        from ranked cross join (values ('zipf'), ('n_senses'), ('rating')) as p(property)""")
    con.execute("drop table items")
    return con.execute("select count(*) from stg_analysis_values").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--resamples", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--threads", type=int, default=None, help="default: the engine's (CPUs, at most 4)")
    args = parser.parse_args()
    con = duckdb.connect()
    con.execute("select setseed(0.19)")
    t = time.perf_counter()
    rows = stage_synthetic(con, args.items)
    print(f"staged {rows:,} value rows ({args.items:,} items x 3 properties) in {time.perf_counter() - t:.1f} s; "
          f"peak RSS {peak_rss_gib():.2f} GiB")
    batch = max(1, DEFAULT_PARAMS["bootstrap_batch_rows"] // rows)
    for resamples in args.resamples:
        t, cpu = time.perf_counter(), time.process_time()
        stage_replicates(con, BOOTSTRAP, DEFAULT_PARAMS["seed"], resamples, min(batch, resamples), args.threads)
        wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        n = con.execute(f"select count(*) from {BOOTSTRAP}").fetchone()[0]
        print(f"{resamples} resamples: {wall:.1f} s wall ({wall / resamples:.3f} s each), {cpu:.1f} s CPU, "
              f"{n:,} replicate rows; peak RSS {peak_rss_gib():.2f} GiB")


if __name__ == "__main__":
    main()
