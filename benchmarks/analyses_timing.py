"""Time each audit analysis on a stored release: what the intervals cost (issue 34).

    python benchmarks/analyses_timing.py --root ROOT [--repeats 5]

ROOT holds one audited (model, release), e.g. ``normaudit audit --model minilm-l6 --probes
wordnet-reverse-dictionary --root ROOT``. Run it from two checkouts (before and after a change) in turns, on
the same root, to compare their analyses on the same machine in the same hour (docs/benchmarks.md).

Opens the catalog afresh for every repeat (so tables staged on a connection, e.g. the retrieval search,
are not reused between repeats), runs pipeline.analysis.analyses.run_analysis for every name in
AUDIT_ANALYSES in order, and prints per-analysis median wall and CPU seconds (process time: every thread of
the process, so less sensitive to a busy machine than wall time) and the medians of the per-repeat totals;
where the query-level bootstrap of issue 34 exists, it is run once more after each repeat, on the same
connection, and its CPU share of the analyses printed (a baseline in the same process).
The catalog open time is reported apart and is not part of the total.
Uses only public functions: pipeline.storage.store.Store, pipeline.storage.catalog.open_catalog,
pipeline.analysis.analyses.{AUDIT_ANALYSES, run_analysis}.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from pipeline.analysis.analyses import AUDIT_ANALYSES, run_analysis
from pipeline.analysis.sql import DEFAULT_PARAMS

try:  # absent before issue 34: the script also times a checkout from before it
    from pipeline.analysis.retrieval_intervals import stage_retrieval_replicates
except ImportError:
    stage_retrieval_replicates = None
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import Store


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    store = Store(args.root)
    con = open_catalog(store)
    pairs = con.execute("select distinct model, release from embeddings order by 1, 2").fetchall()
    counts = con.execute(
        "select e.probe_set, i.kind, count(*) from embeddings e join probe_items i "
        "using (probe_set, item_id) group by 1, 2 order by 1, 2").fetchall()
    con.close()
    if len(pairs) != 1:
        raise SystemExit(f"expected one model/release in {args.root}, found {pairs}")
    model, release = pairs[0]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    print(f"root {args.root}; model {model} release {release}; cwd commit {commit}")
    for ps, kind, n in counts:
        print(f"  embedded: {ps} {kind} {n}")

    times = {name: [] for name in AUDIT_ANALYSES}
    cpus = {name: [] for name in AUDIT_ANALYSES}
    rows = {name: [] for name in AUDIT_ANALYSES}
    totals, opens, cpu_totals, bootstrap_cpu = [], [], [], []
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        con = open_catalog(store)
        opens.append(time.perf_counter() - t0)
        total = cpu_total = 0.0
        for name in AUDIT_ANALYSES:
            t0, c0 = time.perf_counter(), time.process_time()
            out = run_analysis(con, name, model, release, run_id="bench")
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            times[name].append(dt)
            cpus[name].append(dc)
            rows[name].append(out.height)
            total += dt
            cpu_total += dc
        if stage_retrieval_replicates is not None:  # the query-level bootstrap alone, again, in this process
            c0 = time.process_time()
            stage_retrieval_replicates(con, DEFAULT_PARAMS["seed"], DEFAULT_PARAMS["resamples"])
            bootstrap_cpu.append(time.process_time() - c0)
        con.close()
        totals.append(total)
        cpu_totals.append(cpu_total)
        print(f"repeat {rep + 1}: total {total:.3f} s, cpu {cpu_total:.3f} s (open_catalog {opens[-1]:.3f} s) "
              + " ".join(f"{n}={times[n][-1]:.3f}" for n in AUDIT_ANALYSES), flush=True)

    print(f"\n{'analysis':<28}{'median s':>10}{'min s':>10}{'max s':>10}{'cpu med s':>11}{'rows':>6}")
    for name in AUDIT_ANALYSES:
        t = times[name]
        print(f"{name:<28}{statistics.median(t):>10.3f}{min(t):>10.3f}{max(t):>10.3f}"
              f"{statistics.median(cpus[name]):>11.3f}{rows[name][-1]:>6}")
    print(f"{'TOTAL (median of totals)':<28}{statistics.median(totals):>10.3f}{min(totals):>10.3f}"
          f"{max(totals):>10.3f}{statistics.median(cpu_totals):>11.3f}")
    print(f"{'open_catalog (not in total)':<28}{statistics.median(opens):>10.3f}")
    if bootstrap_cpu:
        share = statistics.median(bootstrap_cpu) / statistics.median(cpu_totals)
        print(f"query-level bootstrap of the intervals (issue 34), run again after each repeat: median "
              f"{statistics.median(bootstrap_cpu):.3f} CPU-s = {share:.3f} of the analyses' CPU; analyses with it / "
              f"without it: {1 / (1 - share):.3f}")


if __name__ == "__main__":
    main()
