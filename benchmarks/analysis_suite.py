"""The analysis suite in DuckDB SQL against the same statistics in pandas + scipy, on 10 million items.

Builds synthetic stored rows in memory (no vectors: these analyses never read them): ``embeddings``
(norm, n_tokens), ``probe_properties`` in long form (zipf, min_depth, rating_sd: 3 rows per item),
``probe_items`` (word texts, for the token table), ``probe_relations`` (hypernym pairs) and
``token_norms``. Then times, in one process, the audit's SQL (norm_vs_property, norm_vs_property_ci,
norm_by_bin, hypernym_pairs, token_norm_vs_frequency) against an idiomatic pandas + scipy
implementation of the same statistics, checks that both give the same numbers, and prints the ratio
and the peak resident memory of each side. Each side runs with only its own copy of the rows in memory
(DuckDB's tables are dropped before the pandas frames are built from the same seeded rows).

The bootstrap runs with ``--resamples`` replicates (default 10) on both sides. The audit's suite draws
1,000 (for probe sets of thousands to tens of thousands of items); 1,000 replicates of 10 million items are
10^10 row-operations, beyond this machine for either implementation, and 10 are the most the pandas side
runs in a few minutes (~160 s of its ~250). The bootstrap is most of the suite's work at the audit's
1,000, so its share here is already below what an audit sees; fewer replicates shrink it further (3 were
the default while DuckDB held every replicate at once and 10 did not fit). The audit's side computes the
replicates as an audit does, with numpy from DuckDB's staged rows (``pipeline/analysis/bootstrap.py``; in SQL
until issue 19), in batches (``bootstrap_batch_rows``) of cache-sized chunks, so more of them cost time, not
memory. The bootstrap's own ratio and the rest's are printed apart.

    python benchmarks/analysis_suite.py [--items 10000000] [--resamples 10] [--duckdb-memory 10GB]
                                        [--plain-connection]

DuckDB runs on a connection made as the audit's catalog makes it (``pipeline.storage.catalog.connect``: the
default memory limit, 80% of RAM, and freed buffer memory kept until the connection closes) unless
``--duckdb-memory`` sets a limit or ``--plain-connection`` asks for a plain ``duckdb.connect()``.
"""

from __future__ import annotations

import argparse
import gc
import time

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import stats

from pipeline.analysis.sql import run_query
from pipeline.storage.catalog import connect

SUITE = [
    "norm_vs_property",
    "norm_vs_property_ci",
    "norm_by_bin",
    "hypernym_pairs",
    "token_norm_vs_frequency",
]
PARAMS = {"model": "m", "release": "r", "n_bins": 10, "zipf_tolerance": 0.25, "seed": 7}
M32 = np.uint64(2**32)


# ---------- memory: peak resident set size per phase (Linux) ----------
def reset_peak() -> None:
    """Reset the kernel's high-water mark of resident memory for this process (VmHWM)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def meminfo_gib(*keys: str) -> dict[str, float]:
    """Fields of /proc/meminfo in GiB (Linux): the machine's memory state, which moves the timings."""
    with open("/proc/meminfo") as fh:
        fields = dict(line.split(":", 1) for line in fh)
    return {k: int(fields[k].split()[0]) / 2**20 for k in keys}


def peak_gib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


# ---------- data ----------
def build(n: int, seed: int = 0) -> dict[str, pa.Table]:
    """Synthetic stored rows for one model release and one probe set of ``n`` words."""
    rng = np.random.default_rng(seed)
    ids = pa.array(np.char.add("w", np.char.zfill(np.arange(n).astype(str), 8)))
    zipf = np.round(rng.uniform(1, 7, n), 2)
    depth = rng.integers(0, 18, n).astype(np.float64)
    rating_sd = rng.gamma(4, 0.25, n)
    n_tokens = (1 + rng.poisson(1.5, n)).astype(np.int32)
    norm = np.exp(0.3 - 0.03 * zipf + 0.01 * depth + 0.01 * n_tokens + rng.normal(0, 0.1, n))
    emb = pa.table(
        {
            "model": pa.array(["m"] * n),
            "release": pa.array(["r"] * n),
            "probe_set": pa.array(["bench"] * n),
            "item_id": ids,
            "norm": norm,
            "n_tokens": n_tokens,
        }
    )
    props = pa.concat_tables(
        [
            pa.table(
                {
                    "probe_set": pa.array(["bench"] * n),
                    "item_id": ids,
                    "property": pa.array([name] * n),
                    "value": values,
                }
            )
            for name, values in (("zipf", zipf), ("min_depth", depth), ("rating_sd", rating_sd))
        ]
    )
    items = pa.table(
        {"probe_set": pa.array(["bench"] * n), "item_id": ids, "text": ids, "kind": pa.array(["word"] * n)}
    )
    pairs = rng.permutation(n)[: 2 * (n // 10)].reshape(-1, 2)
    relations = pa.table(
        {
            "probe_set": pa.array(["bench"] * len(pairs)),
            "left_id": ids.take(pairs[:, 0]),
            "right_id": ids.take(pairs[:, 1]),
            "relation": pa.array(["hypernym_of"] * len(pairs)),
            "value": np.ones(len(pairs)),
        }
    )
    n_vocab = min(30_000, n)  # a token table of BERT's size, or every word of a smaller run
    vocab = rng.choice(n, n_vocab, replace=False)
    tokens = pa.table(
        {
            "model": ["m"] * n_vocab,
            "release": ["r"] * n_vocab,
            "token_id": np.arange(n_vocab, dtype=np.int64),
            "token": ids.take(vocab),
            "norm": np.exp(rng.normal(0, 0.2, n_vocab) - 0.02 * zipf[vocab]),
        }
    )
    return {
        "embeddings": emb,
        "probe_properties": props,
        "probe_items": items,
        "probe_relations": relations,
        "token_norms": tokens,
    }


# ---------- the pandas + scipy implementation ----------
def _mix32(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(16))
    x = (x * np.uint64(0x7FEB352D)) % M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) % M32
    return x ^ (x >> np.uint64(16))


def poisson_weights(seed: int, b: int, n: int) -> np.ndarray:
    """Replicate b's Poisson(1) weights of items 0..n-1, as sql/norm_vs_property_ci.sql defines them."""
    key = _mix32(np.array([(seed * 2654435769 + b) % 2**32], dtype=np.uint64))
    h = _mix32(key ^ np.arange(n, dtype=np.uint64))
    thresholds = np.floor(stats.poisson.cdf(np.arange(10), 1.0) * 2.0**32).astype(np.uint64)
    return np.searchsorted(thresholds, h, side="right")


def _partial(r_xy: float, r_xz: float, r_yz: float) -> float:
    return (r_xy - r_xz * r_yz) / np.sqrt((1 - r_xz**2) * (1 - r_yz**2))


def _correlations(norm, value, zipf, n_tokens, with_zipf: bool) -> dict[str, float]:
    rx, ry, rt = stats.rankdata(norm), stats.rankdata(value), stats.rankdata(n_tokens)
    r = {
        "spearman": stats.pearsonr(rx, ry).statistic,
        "pearson_log_norm": stats.pearsonr(np.log(norm), value).statistic,
    }
    r["partial_spearman_n_tokens"] = _partial(
        r["spearman"], stats.pearsonr(rx, rt).statistic, stats.pearsonr(ry, rt).statistic
    )
    if with_zipf:
        rz = stats.rankdata(zipf)
        r["partial_spearman_zipf"] = _partial(
            r["spearman"], stats.pearsonr(rx, rz).statistic, stats.pearsonr(ry, rz).statistic
        )
    return r


def _prepare(frames: dict[str, pd.DataFrame]) -> dict:
    emb, props = frames["embeddings"], frames["probe_properties"]
    emb = emb.sort_values("item_id", ignore_index=True)
    emb["pos"] = np.arange(len(emb))
    zipf = props.loc[props["property"] == "zipf", ["item_id", "value"]].rename(columns={"value": "zipf"})
    joined = props.merge(emb[["item_id", "pos", "norm", "n_tokens"]], on="item_id").merge(
        zipf, on="item_id", how="left"
    )
    groups = {p: g.sort_values("pos") for p, g in joined.groupby("property", observed=True)}
    return {"emb": emb, "zipf": zipf, "groups": groups}


def pd_norm_vs_property(frames, prep, resamples) -> pd.DataFrame:
    rows = []
    for prop, g in prep["groups"].items():
        r = _correlations(
            g["norm"].to_numpy(),
            g["value"].to_numpy(),
            g["zipf"].to_numpy(),
            g["n_tokens"].to_numpy(),
            prop != "zipf",
        )
        rows += [{"property": prop, "statistic": k, "value": v, "n": len(g)} for k, v in r.items()]
    return pd.DataFrame(rows)


def pd_norm_vs_property_ci(frames, prep, resamples) -> pd.DataFrame:
    reps = []
    for b in range(resamples):
        w = poisson_weights(PARAMS["seed"], b, len(prep["emb"]))
        for prop, g in prep["groups"].items():
            idx = np.repeat(np.arange(len(g)), w[g["pos"].to_numpy()])
            r = _correlations(
                g["norm"].to_numpy()[idx],
                g["value"].to_numpy()[idx],
                g["zipf"].to_numpy()[idx],
                g["n_tokens"].to_numpy()[idx],
                prop != "zipf",
            )
            reps += [{"property": prop, "statistic": k, "value": v} for k, v in r.items()]
    return (
        pd.DataFrame(reps)
        .groupby(["property", "statistic"])["value"]
        .quantile([0.025, 0.975])
        .unstack()
        .rename(columns={0.025: "ci_low", 0.975: "ci_high"})
        .reset_index()
    )


def pd_norm_by_bin(frames, prep, resamples) -> pd.DataFrame:
    bins = []
    for prop, g in prep["groups"].items():
        g = g.sort_values(["value", "item_id"])
        if g["value"].nunique() <= PARAMS["n_bins"]:
            label = g["value"].rank(method="dense").astype(int).to_numpy()
        else:
            label = np.repeat(
                np.arange(1, PARAMS["n_bins"] + 1),
                [len(a) for a in np.array_split(np.arange(len(g)), PARAMS["n_bins"])],
            )
        s = g.assign(bin=label).groupby("bin")["norm"]
        q = s.quantile([0.25, 0.5, 0.75]).unstack()
        bins.append(
            pd.DataFrame(
                {
                    "property": prop,
                    "bin": q.index,
                    "mean": s.mean().to_numpy(),
                    "median": q[0.5].to_numpy(),
                    "iqr": (q[0.75] - q[0.25]).to_numpy(),
                }
            )
        )
    return pd.concat(bins)


def pd_hypernym_pairs(frames, prep, resamples) -> pd.DataFrame:
    emb, zipf, rel = prep["emb"], prep["zipf"], frames["probe_relations"]
    pairs = (
        rel[rel["relation"] == "hypernym_of"]
        .merge(
            emb[["item_id", "norm"]].rename(columns={"item_id": "left_id", "norm": "g_norm"}), on="left_id"
        )
        .merge(
            emb[["item_id", "norm"]].rename(columns={"item_id": "right_id", "norm": "s_norm"}), on="right_id"
        )
        .merge(zipf.rename(columns={"item_id": "left_id", "zipf": "g_zipf"}), on="left_id", how="left")
        .merge(zipf.rename(columns={"item_id": "right_id", "zipf": "s_zipf"}), on="right_id", how="left")
    )
    greater = (pairs["s_norm"] > pairs["g_norm"]).to_numpy()
    matched = ((pairs["s_zipf"] - pairs["g_zipf"]).abs() <= PARAMS["zipf_tolerance"]).to_numpy()
    hyp = []
    for name, mask in (
        ("share_hyponym_norm_greater", np.ones_like(greater)),
        ("share_hyponym_norm_greater_zipf_matched", matched),
    ):
        k, n = int(greater[mask].sum()), int(mask.sum())
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        hyp.append({"statistic": name, "value": k / n, "ci_low": ci.low, "ci_high": ci.high, "n": n})
    return pd.DataFrame(hyp)


def pd_token_norm_vs_frequency(frames, prep, resamples) -> pd.DataFrame:
    tok, items, props = frames["token_norms"], frames["probe_items"], frames["probe_properties"]
    words = tok[~tok["token"].str.startswith("##")].assign(word=lambda d: d["token"].str.lower())
    freq = items[items["kind"] == "word"].merge(
        props[props["property"] == "zipf"], on=["probe_set", "item_id"]
    )
    freq = freq.assign(word=freq["text"].str.lower()).groupby("word", as_index=False)["value"].mean()
    m = words.merge(freq, on="word")
    return pd.DataFrame(
        [
            {"statistic": "spearman", "value": stats.spearmanr(m["norm"], m["value"]).statistic, "n": len(m)},
            {
                "statistic": "pearson_log_norm",
                "value": stats.pearsonr(np.log(m["norm"]), m["value"]).statistic,
            },
        ]
    )


PANDAS = {
    "norm_vs_property": pd_norm_vs_property,
    "norm_vs_property_ci": pd_norm_vs_property_ci,
    "norm_by_bin": pd_norm_by_bin,
    "hypernym_pairs": pd_hypernym_pairs,
    "token_norm_vs_frequency": pd_token_norm_vs_frequency,
}


def pandas_suite(frames: dict[str, pd.DataFrame], resamples: int) -> tuple[dict, dict]:
    """Every statistic of the suite with pandas + scipy; returns (results, seconds per analysis)."""
    times = {}
    t = time.perf_counter()
    prep = _prepare(frames)  # the shared merge, as a pandas user would do it once
    times["(shared merge)"] = time.perf_counter() - t
    out = {}
    for name, fn in PANDAS.items():
        t = time.perf_counter()
        out[name] = fn(frames, prep, resamples)
        times[name] = time.perf_counter() - t
    return out, times


# ---------- agreement ----------
def check_agreement(sql: dict, ref: dict) -> float:
    """Largest absolute difference between the two implementations over the statistics both report."""
    worst = 0.0
    a = sql["norm_vs_property"].to_pandas().merge(ref["norm_vs_property"], on=["property", "statistic"])
    worst = max(worst, (a["value_x"] - a["value_y"]).abs().max())
    a = sql["norm_vs_property_ci"].to_pandas().merge(ref["norm_vs_property_ci"], on=["property", "statistic"])
    worst = max(
        worst, (a["ci_low_x"] - a["ci_low_y"]).abs().max(), (a["ci_high_x"] - a["ci_high_y"]).abs().max()
    )
    b = sql["norm_by_bin"].to_pandas()
    b = b[b["statistic"].str.endswith(("_mean", "_median", "_iqr"))]
    b = b.assign(bin=b["statistic"].str[3:5].astype(int), stat=b["statistic"].str[6:])
    r = ref["norm_by_bin"].melt(id_vars=["property", "bin"], var_name="stat")
    m = b.merge(r, on=["property", "bin", "stat"])
    worst = max(worst, (m["value_x"] - m["value_y"]).abs().max())
    for name in ("hypernym_pairs", "token_norm_vs_frequency"):
        m = sql[name].to_pandas().merge(ref[name], on="statistic")
        worst = max(worst, (m["value_x"] - m["value_y"]).abs().max())
    return float(worst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000_000)
    parser.add_argument("--resamples", type=int, default=10)
    parser.add_argument("--duckdb-memory", default=None,
                        help="DuckDB memory_limit (it spills beyond); default: DuckDB's, as in the audit")
    parser.add_argument("--plain-connection", action="store_true",
                        help="a plain duckdb.connect() instead of the catalog's connection "
                             "(pipeline.storage.catalog.connect)")
    args = parser.parse_args()
    mem = meminfo_gib("MemFree", "Cached")
    # DuckDB's side faults in ~9 GiB of fresh memory: with a full page cache the kernel reclaims it page by
    # page, and the first query ran 1.5x slower here (18.0 vs 12.3 s with the cache dropped)
    print(f"memory at start: {mem['MemFree']:.1f} GiB free, {mem['Cached']:.1f} GiB page cache")
    t0 = time.perf_counter()
    tables = build(args.items)
    print(
        f"built {args.items:,} embedding rows, {tables['probe_properties'].num_rows:,} property rows, "
        f"{tables['probe_relations'].num_rows:,} hypernym pairs in {time.perf_counter() - t0:.1f} s"
    )

    con = duckdb.connect() if args.plain_connection else connect()
    if args.duckdb_memory:
        con.execute(f"set memory_limit = '{args.duckdb_memory}'")  # a setting, not a query parameter
    for name, table in tables.items():
        con.register(f"{name}_arrow", table)
        con.execute(f"create table {name} as select * from {name}_arrow")
        con.unregister(f"{name}_arrow")
    # each side runs with only its own copy of the rows in memory: the other's would crowd it
    del tables
    gc.collect()
    threads, limit, kept = con.execute(
        "select current_setting('threads'), current_setting('memory_limit'), current_setting('block_allocator_memory')"
    ).fetchone()
    print(f"DuckDB {duckdb.__version__}, {threads} threads, memory limit {limit}, freed memory kept up to {kept}; "
          f"pandas {pd.__version__} (one thread)")

    reset_peak()
    sql, sql_times = {}, {}
    for name in SUITE:
        t = time.perf_counter()
        sql[name] = run_query(con, name, resamples=args.resamples, **PARAMS)
        sql_times[name] = time.perf_counter() - t
    sql_peak = peak_gib()
    con.close()
    del con
    gc.collect()

    frames = {name: table.to_pandas() for name, table in build(args.items).items()}  # the same rows (seeded)
    gc.collect()
    reset_peak()
    ref, pandas_times = pandas_suite(frames, args.resamples)
    pandas_s = sum(pandas_times.values())
    pandas_peak = peak_gib()

    duck_s = sum(sql_times.values())
    print("\nDuckDB SQL, per query (s):  " + ", ".join(f"{k} {v:.1f}" for k, v in sql_times.items()))
    print("pandas + scipy, per part (s): " + ", ".join(f"{k} {v:.1f}" for k, v in pandas_times.items()))
    print(f"DuckDB SQL suite:    {duck_s:8.1f} s   peak RSS {sql_peak:5.1f} GiB (process, data included)")
    print(
        f"pandas + scipy:      {pandas_s:8.1f} s   peak RSS {pandas_peak:5.1f} GiB (process, data included)"
    )
    print(f"ratio pandas / DuckDB: {pandas_s / duck_s:.2f}x   (bootstrap replicates: {args.resamples})")
    ci = "norm_vs_property_ci"
    print(f"  the bootstrap ({ci}) alone: {pandas_times[ci] / sql_times[ci]:.1f}x "
          f"({sql_times[ci]:.1f} vs {pandas_times[ci]:.1f} s); the rest: "
          f"{(pandas_s - pandas_times[ci]) / (duck_s - sql_times[ci]):.1f}x "
          f"({duck_s - sql_times[ci]:.1f} vs {pandas_s - pandas_times[ci]:.1f} s)")
    print(f"largest difference between the two implementations: {check_agreement(sql, ref):.2e}")


if __name__ == "__main__":
    main()
