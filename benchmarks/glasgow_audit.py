"""A Glasgow-norms-shaped audit: do the analyses cost no more than embedding? And are the intervals right?

Synthesises a probe CSV shaped like the Glasgow norms (4,681 words x 11 rated properties): wordfreq's most
frequent alphabetic English words, each with 11 seeded uniform ratings on a 1-7 scale (three decimals; fixed
seed). Runs the installed CLI, as a user would, in a subprocess without PREFECT_API_URL:

    normaudit audit --model minilm-l6 --probes FILE --root TMP --timings

parses its timings table, and prints embed_probes seconds, run_analyses seconds and their ratio (target
analyses / embedding <= 1.0). Then recomputes every norm_vs_property interval of that run with an independent
numpy/scipy bootstrap (weights re-derived from the documented hash of pipeline/analysis/bootstrap.py, the
resample built with numpy.repeat, ranks by scipy.stats.rankdata over it, Pearson correlations of them,
partial correlations as those of least-squares residuals, numpy.quantile) and prints the largest absolute
difference from the stored ci_low / ci_high (target <= 1e-9).

    python benchmarks/glasgow_audit.py [--root DIR] [--words 4681] [--seed 19]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats
from wordfreq import top_n_list

from pipeline.analysis.sql import DEFAULT_PARAMS
from pipeline.settings import Settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import poisson_weights  # noqa: E402 - the repository root is put on the path first

PROPERTIES = ("arousal", "valence", "dominance", "concreteness", "imageability", "familiarity", "aoa", "size",
              "gender", "semsize", "semgender")
MODEL = "minilm-l6"


def write_probes(path: Path, words: int, seed: int) -> None:
    vocabulary = [w for w in top_n_list("en", 4 * words) if w.isalpha()][:words]
    if len(vocabulary) < words:
        sys.exit(f"wordfreq lists only {len(vocabulary)} alphabetic words in its top {4 * words}; ask for fewer")
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({"item_id": [f"w{i:05d}" for i in range(words)], "text": vocabulary,
                          **{p: np.round(rng.uniform(1, 7, words), 3) for p in PROPERTIES}})
    frame.write_csv(path)


def run_audit(probes: Path, root: Path) -> tuple[dict[str, float], str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["COLUMNS"] = "200"  # the rich tables print whole
    cli = Path(sys.executable).with_name("normaudit")
    cmd = [str(cli), "audit", "--model", MODEL, "--probes", str(probes), "--root", str(root), "--timings"]
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if done.returncode:
        sys.exit(f"the audit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    row = re.compile(r"[│|]\s*([\w.-]+)\s*[│|]\s*(\d+)\s*[│|]\s*([\d.]+)\s*[│|]")  # step | runs | seconds
    timings = {m[1]: float(m[3]) for m in row.finditer(done.stdout)}
    run_id = re.search(r"run (\S+?);", done.stdout)
    if "embed_probes" not in timings or "run_analyses" not in timings or run_id is None:
        sys.exit(f"no timings or run id in the audit's output:\n{done.stdout[-3000:]}")
    timings["audit (whole CLI call)"] = wall
    return timings, run_id[1]


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


def _residual(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y less its least-squares fit (with intercept) on x."""
    x, y = x - x.mean(), y - y.mean()
    return y - (x @ y) / (x @ x) * x


def reference_intervals(root: Path, run_id: str, resamples: int, seed: int) -> dict[tuple, tuple[float, float]]:
    """Every norm_vs_property interval of the run, recomputed replicate by replicate on numpy.repeat'ed items."""
    con = open_catalog(open_store(Settings(root=str(root))))
    release = con.execute("select distinct release from results where run_id = $r", {"r": run_id}).fetchall()[0][0]
    items = con.sql("select probe_set, item_id, norm, n_tokens from embeddings "
                    "where model = $m and release = $r order by probe_set, item_id",
                    params={"m": MODEL, "r": release}).pl()
    props = con.sql("select probe_set, item_id, property, value from probe_properties where value is not null").pl()
    out = {}
    for (probe_set,), emb in items.group_by(["probe_set"], maintain_order=True):
        ids = emb["item_id"].to_list()
        weights = poisson_weights(seed, resamples, len(ids))  # position = place in item_id order
        mine = props.filter(pl.col("probe_set") == probe_set)
        zipf = _column(mine, "zipf", ids)
        norm, tokens = emb["norm"].to_numpy(), emb["n_tokens"].to_numpy().astype(float)
        samples = {}
        for prop in mine["property"].unique().sort().to_list():
            values = _column(mine, prop, ids)
            has = ~np.isnan(values)
            both = has & ~np.isnan(zipf)
            statistics = ["spearman", "pearson_log_norm"]
            if tokens[has].min() < tokens[has].max():
                statistics.append("partial_spearman_n_tokens")
            if prop != "zipf" and both.any():
                statistics.append("partial_spearman_zipf")
            samples[prop] = (values, has, both, {s: [] for s in statistics})
        for w in weights:
            resampled = {}  # per item subset: the resample's rows and the ranks every property shares

            def resample(mask: np.ndarray, control: str, cache=resampled, w=w, norm=norm, tokens=tokens, zipf=zipf):
                key = (mask.tobytes(), control)
                if key not in cache:
                    idx = np.repeat(np.flatnonzero(mask), w[mask])
                    by = tokens if control == "n_tokens" else zipf
                    cache[key] = (idx, stats.rankdata(norm[idx]), stats.rankdata(by[idx]))
                return cache[key]

            for values, has, both, reps in samples.values():
                idx, r_norm, r_tokens = resample(has, "n_tokens")
                r_value = stats.rankdata(values[idx])
                reps["spearman"].append(_corr(r_norm, r_value))
                reps["pearson_log_norm"].append(_corr(np.log(norm[idx]), values[idx]))
                if "partial_spearman_n_tokens" in reps:
                    reps["partial_spearman_n_tokens"].append(
                        _corr(_residual(r_norm, r_tokens), _residual(r_value, r_tokens)))
                if "partial_spearman_zipf" in reps:
                    jdx, r_norm_z, r_zipf = resample(both, "zipf")
                    r_value_z = stats.rankdata(values[jdx])
                    reps["partial_spearman_zipf"].append(
                        _corr(_residual(r_norm_z, r_zipf), _residual(r_value_z, r_zipf)))
        for prop, (_, _, _, reps) in samples.items():
            for statistic, v in reps.items():
                v = np.asarray(v)
                out[(probe_set, prop, statistic)] = tuple(np.quantile(v[np.isfinite(v)], [0.025, 0.975]))
    return out


def _column(frame: pl.DataFrame, prop: str, ids: list[str]) -> np.ndarray:
    got = dict(frame.filter(pl.col("property") == prop).select("item_id", "value").iter_rows())
    return np.array([got.get(i, np.nan) for i in ids], dtype=float)


def stored_intervals(root: Path, run_id: str) -> dict[tuple, tuple[float, float]]:
    con = open_catalog(open_store(Settings(root=str(root))))
    rows = con.execute("select probe_set, property, statistic, ci_low, ci_high from results "
                       "where run_id = $r and analysis = 'norm_vs_property'", {"r": run_id}).fetchall()
    return {(p, q, s): (lo, hi) for p, q, s, lo, hi in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None, help="store root (default: a temporary folder)")
    parser.add_argument("--words", type=int, default=4681)
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="glasgow-"))
    root = args.root or tmp / "root"
    try:
        probes = tmp / "glasgow.csv"
        write_probes(probes, args.words, args.seed)
        print(f"probe set: {args.words} words x {len(PROPERTIES)} ratings ({probes})", flush=True)
        timings, run_id = run_audit(probes, root)
        for step in ("embed_probes", "run_analyses", "audit (whole CLI call)"):
            print(f"{step:24s} {timings[step]:8.2f} s")
        print(f"analyses / embedding: {timings['run_analyses'] / timings['embed_probes']:.2f}  (target <= 1.0)")
        t = time.perf_counter()
        expected = reference_intervals(root, run_id, DEFAULT_PARAMS["resamples"], DEFAULT_PARAMS["seed"])
        got = stored_intervals(root, run_id)
        missing = set(expected) ^ set(got)
        if missing:
            sys.exit(f"intervals only one side has: {sorted(missing)[:5]}")
        worst = max(abs(a - b) for key in expected for a, b in zip(expected[key], got[key], strict=True))
        print(f"{len(got)} intervals ({DEFAULT_PARAMS['resamples']} resamples) against a numpy/scipy bootstrap "
              f"({time.perf_counter() - t:.0f} s): largest |difference| {worst:.2e}  (target <= 1e-9)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
