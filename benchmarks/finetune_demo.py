"""Issue 20's demo end to end with the installed CLI: fine-tune MiniLM (adamw, then sgd), audit every adamw
checkpoint as a release with `normaudit serve --once`, and print what moved; figures for docs/theory.md.

Run:  python benchmarks/finetune_demo.py --work DIR [--img docs/img] [--model minilm-l6]

In DIR (reused: a finished step is skipped, so a rerun only prints): ``normaudit theory finetune`` for each
optimizer with its defaults, ``normaudit serve --config infra/finetune-audits.yaml --once`` (the README's
config), then, from the stored data only:
1. each run's wall time, checkpoints and the formula's out-of-sample scores (``normaudit theory formula``);
2. per checkpoint (release), from ``results``: success@1/@10 on the unseen test definitions, Spearman(norm,
   zipf) and partial Spearman(norm, min_depth | zipf) on the nouns, the hyponym-longer share on the pairs,
   the AUROC of the query norm for success@1, with 95% CIs;
3. the paired comparisons of consecutive checkpoints that differ (``comparisons``, verdict ``differs``);
4. two PNGs: norm trajectories by zipf quartile, and predicted vs observed norms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.probes.wordnet import load_wordnet_nouns  # noqa: E402
from pipeline.storage.catalog import open_catalog  # noqa: E402
from pipeline.storage.store import Store  # noqa: E402
from pipeline.theory.finetune import FinetuneConfig, read_run  # noqa: E402
from pipeline.theory.trace_formula import formula_predictions, read_trace  # noqa: E402
from pipeline.theory.trace_plots import formula_scatter, norm_trajectories  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("normaudit"))
WATCHED = "minilm-ft"


def cli(*args: str, cwd: Path) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "NORMAUDIT_"))}
    env["COLUMNS"] = "200"
    t = time.perf_counter()
    out = subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"normaudit {' '.join(args)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return out.returncode, out.stdout, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for the checkpoints and the root (kept, reused)")
    ap.add_argument("--img", help="folder for the two PNGs (e.g. docs/img)")
    ap.add_argument("--model", default="minilm-l6")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    root = work / "normaudit-data"  # the default root, relative to the folder the commands run in
    store = Store(str(root))
    runs = {}
    for optimizer in ("adamw", "sgd"):
        label = FinetuneConfig(model=args.model, optimizer=optimizer).label()
        runs[optimizer] = label
        if store.exists(f"training_trace/{label}/run.json") and (work / "normaudit-checkpoints" / label).exists():
            print(f"{label}: already trained")
            continue
        _, out, secs = cli("theory", "finetune", "--model", args.model, "--optimizer", optimizer, cwd=work)
        print(out)
        print(f"{label}: `normaudit theory finetune` took {secs / 60:.1f} min (wall, with start-up)\n")
    _, out, secs = cli("serve", "--config", str(REPO / "infra" / "finetune-audits.yaml"), "--once", cwd=work)
    print(out + f"serve --once: {secs / 60:.1f} min\n")
    for label in runs.values():
        print(cli("theory", "formula", "--run", label, cwd=work)[1])

    con = open_catalog(store)
    per_release = con.sql(f"""
        select release, probe_set, property, statistic, round(value, 4) as value, round(ci_low, 4) as ci_low,
               round(ci_high, 4) as ci_high, n
        from results where model = '{WATCHED}' and (
            (property = 'retrieval' and statistic in ('mean_success_at_1', 'mean_success_at_10'))
            or (property = 'success_at_1' and statistic = 'auroc_query_norm')
            or (probe_set = 'wordnet-nouns' and property = 'zipf' and statistic = 'spearman')
            or (probe_set = 'wordnet-nouns' and property = 'min_depth' and statistic = 'partial_spearman_zipf')
            or (analysis = 'hypernym_pairs' and statistic like 'share_hyponym_norm_greater%'))
        order by probe_set, property, statistic, release""").pl()
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_width_chars=200):
        print(per_release)
        moved = con.sql(f"""
            select base_release, release, probe_set, property, statistic, round(difference, 4) as difference,
                   round(ci_low, 4) as ci_low, round(ci_high, 4) as ci_high
            from comparisons where model = '{WATCHED}' and verdict = 'differs' and statistic in
                ('spearman', 'mean_success_at_10', 'auroc_query_norm', 'share_hyponym_norm_greater')
            order by base_release, probe_set, property""").pl()
        print(moved)
    if args.img:
        img = Path(args.img)
        img.mkdir(parents=True, exist_ok=True)
        zipf = load_wordnet_nouns().properties.filter(pl.col("property") == "zipf").select(
            "item_id", pl.col("value").alias("zipf"))
        traces = {f"{opt}: {label}": read_trace(store, label) for opt, label in runs.items()}
        (img / "finetune_norm_trajectories.png").write_bytes(norm_trajectories(traces, zipf))
        items = {title: formula_predictions(trace, read_run(store, title.split(": ")[1])["weight_decay"])[0]
                 for title, trace in traces.items()}
        (img / "finetune_predicted_vs_observed.png").write_bytes(formula_scatter(items))
        print(f"figures in {img}")


if __name__ == "__main__":
    main()
