"""Issue 28: does fine-tuning imprint specificity in a real encoder's norms beyond seed noise and beyond a
shuffled-pairs control, and does the norm reach the formula's equilibrium where the run can get there?

Run:  nice -n 15 python benchmarks/imprint.py --work DIR [--img docs/img] [--seeds 3] [--steps 300]
          [--batch-size 8] [--max-seq-length 32] [--limit 1200] [--mid] [--jobs 3] [--threads 1]
          [--equilibrium-steps 180] [--default-finetune]

Stages (each skipped when its output exists, so a rerun resumes and a finished grid only prints):
1. **The grid**: `theory finetune`'s training (``pipeline.theory.finetune.finetune``, the task the flow runs)
   for every optimizer (adamw, sgd) x arm (semantic pairs; shuffled pairs: the same definitions matched to a
   seeded permutation of the lemmas) x seed, checkpoints at step 0 and the last step (``--mid``: the middle
   one too); ``--jobs`` processes at a time, ``--threads`` torch threads each. A grid run traces only its
   first and last step.
2. **The equilibrium runs** (issue 28 part 2), in the same pool: each optimizer with ``--decay-norms`` (every
   parameter decayed, LayerNorm weights and biases included) and lambda = 1 / (2 eta tau) with tau = steps / 6,
   so the relaxation time 1/(2 eta lambda) is a sixth of the run; traced every step. The formula is scored out
   of sample against persistence on the whole run and after a burn-in of 3 tau.
3. **Audits**, while the rest trains: step 0 is the same weights in every run (checked by fingerprint), so it
   is audited once (model ``imp-base``) and removed from the run folders; ``normaudit serve --config
   audits.yaml --once`` audits each finished run's checkpoints as releases (model
   ``imp-<optimizer>-<arm>-s<seed>``) on ``--limit`` items of wordnet-nouns, wordnet-pairs and
   wordnet-reverse-dictionary-test.
4. **Paired comparisons**: each run's last checkpoint against step 0 through the paired engine
   (``pipeline.analysis.paired.paired_comparison``, stored in ``comparisons``).
5. **The table**: per statistic and optimizer, the step-0 value, the mean last value, the mean change per arm
   with a t interval over seeds, and semantic minus shuffled (Welch); one figure per statistic (value
   against step, band = range over seeds, both arms) into ``--img``; the equilibrium runs' scores.
``--default-finetune`` also runs the README's `normaudit theory finetune --model minilm-l6` (defaults) from
the command line and prints its output: the trace's share of the default fine-tune's wall time.

Everything is written under DIR (``normaudit-data`` is the root); the numbers also go to DIR/imprint.json.
The defaults are sized for a shared 2-core CPU; on a GPU machine: ``--jobs 1`` and the full-size flags
(e.g. ``--batch-size 32 --max-seq-length 64 --limit 5000 --mid --seeds 5``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.theory.finetune import DEFAULT_LR, FinetuneConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("normaudit"))
OPTIMIZERS, ARMS = ("adamw", "sgd"), ("semantic", "shuffled")
PROBES = ["wordnet-nouns", "wordnet-pairs", "wordnet-reverse-dictionary-test"]
BASE_MODEL, BASE_RELEASE = "imp-base", "step-000000"


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "NORMAUDIT_"))}
    env["COLUMNS"] = "200"
    return env


# The libraries' own bars and logs (the spawned trainers and the CLI inherit these, as `theory finetune` sets them)
QUIET = {"TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error", "DATASETS_VERBOSITY": "error",
         "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def train_one(job: tuple[str, str, int]) -> dict:
    """One fine-tune in a worker process: ``(config json, root, torch threads)`` -> the run's summary."""
    cfg_json, root, threads = job
    from pipeline.settings import load_settings
    from pipeline.storage.store import Store
    from pipeline.theory.finetune import finetune

    cfg = FinetuneConfig.model_validate_json(cfg_json)
    settings = load_settings(root=root, threads_per_worker=threads)
    return finetune(settings, Store(root), cfg, f"imprint-{cfg.label()}")


class Grid:
    """The runs of one invocation and where their outputs go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work).resolve()
        self.root = self.work / "normaudit-data"
        self.ckpt = self.work / "checkpoints"
        self.summaries = self.work / "summaries"
        mid = args.steps // 2
        common = {"model": args.model, "steps": args.steps, "batch_size": args.batch_size,
                  "max_seq_length": args.max_seq_length}
        self.grid: dict[str, FinetuneConfig] = {}
        for optimizer in OPTIMIZERS:
            for arm in ARMS:
                for seed in range(args.seeds):
                    name = f"imp-{optimizer}-{arm}-s{seed}"
                    self.grid[name] = FinetuneConfig(
                        **common, optimizer=optimizer, pairs=arm, seed=seed, run=name, out=str(self.ckpt / name),
                        checkpoint_every=mid if args.mid else args.steps, trace_every=args.steps, trace_nouns=20,
                        trace_definitions=10)
        self.tau = max(1, args.equilibrium_steps // 6)
        self.equilibrium: dict[str, FinetuneConfig] = {}
        for optimizer in OPTIMIZERS if args.equilibrium_steps else ():
            eta = DEFAULT_LR[optimizer]
            name = f"eq-{optimizer}"
            self.equilibrium[name] = FinetuneConfig(
                **{**common, "steps": args.equilibrium_steps}, optimizer=optimizer, seed=0, run=name,
                out=str(self.ckpt / name), weight_decay=1 / (2 * eta * self.tau), decay_norms=True,
                checkpoint_every=args.equilibrium_steps, trace_every=1,
                trace_nouns=args.equilibrium_nouns, trace_definitions=args.equilibrium_definitions)

    def summary_path(self, name: str) -> Path:
        return self.summaries / f"{name}.json"

    def recover(self, name: str, cfg: FinetuneConfig) -> bool:
        """Record a run that finished while this script was not there to take its summary (it stopped while the
        pool still trained): the last checkpoint and the gated trace part of the last step exist. Its seconds
        and loss are unknown (``recovered``)."""
        last = cfg.checkpoint_folder() / f"step-{cfg.steps:06d}"
        part = self.root / "training_trace" / name / f"part-{cfg.steps:06d}.parquet"
        if not ((last / "model.safetensors").exists() and part.exists()):
            return False
        self.summaries.mkdir(parents=True, exist_ok=True)
        self.summary_path(name).write_text(json.dumps(
            {"run": name, "recovered": True, "optimizer": cfg.optimizer, "pairs": cfg.pairs, "seed": cfg.seed,
             "steps": cfg.steps, "weight_decay": cfg.weight_decay, "decay_norms": cfg.decay_norms,
             "folder": str(cfg.checkpoint_folder())}, indent=1))
        print(f"  {name}: finished earlier, recovered from its last checkpoint and trace part", flush=True)
        return True

    def train_and_audit(self) -> tuple[dict[str, dict], float]:
        """Train every run without a summary (a half-finished run's folders are removed first), ``--jobs`` at a
        time; while the others train, audit the finished grid runs (``serve --once`` on those only).

        Returns every run's summary and the seconds spent in ``serve --once``.
        """
        configs = {**self.grid, **self.equilibrium}
        self.summaries.mkdir(parents=True, exist_ok=True)
        todo = []
        for name, cfg in configs.items():
            if self.summary_path(name).exists() or self.recover(name, cfg):
                continue
            shutil.rmtree(cfg.checkpoint_folder(), ignore_errors=True)
            shutil.rmtree(self.root / "training_trace" / name, ignore_errors=True)
            todo.append((name, cfg))
        if todo:
            print(f"training {len(todo)} run(s), {self.args.jobs} at a time: {', '.join(n for n, _ in todo)}",
                  flush=True)
        audit_s, waiting = 0.0, 0
        with ProcessPoolExecutor(max_workers=self.args.jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(train_one, (cfg.model_dump_json(), str(self.root), self.args.threads)): name
                       for name, cfg in todo}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    name, summary = futures[future], future.result()
                    self.summary_path(name).write_text(json.dumps(summary, indent=1))
                    sec = summary["seconds"]
                    print(f"  {name}: {sec['total']:.0f}s (train {sec['train']:.0f}s, trace {sec['trace']:.0f}s, "
                          f"checkpoints {sec['checkpoints']:.0f}s), loss {summary['train_loss']:.3f}", flush=True)
                    waiting += name in self.grid
                if pending and waiting >= max(1, self.args.jobs - 1):  # a wave finished: audit it meanwhile
                    audit_s += self.audit()
                    waiting = 0
        audit_s += self.audit()
        return {name: json.loads(self.summary_path(name).read_text()) for name in configs}, audit_s

    def share_step_zero(self) -> None:
        """Keep one copy of step 0 (the base weights, identical in every run) as ``imp-base``'s release."""
        from pipeline.embedding.models import fingerprint_dir

        base = self.work / "base" / BASE_RELEASE
        for name in self.grid:
            step0 = self.ckpt / name / BASE_RELEASE
            if not step0.exists() or not self.summary_path(name).exists():
                continue
            if not base.exists():
                base.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(step0, base)
            if fingerprint_dir(step0) != fingerprint_dir(base):
                sys.exit(f"{step0} differs from {base}: step 0 must be the base model in every run")
            shutil.rmtree(step0)

    def audit(self) -> float:
        """``normaudit serve --once`` over the base and every finished grid run; returns its wall seconds.

        Releases already audited are skipped by the watcher (their fingerprints), so a call audits only
        what finished since the last one.
        """
        self.share_step_zero()
        finished = [n for n in self.grid if self.summary_path(n).exists()]
        if not finished:
            return 0.0
        config = {"root": str(self.root), "thresholds": {"default": 1.0e9},
                  "watch": [{"name": name, "checkpoints": str(folder), "probes": PROBES, "limit": self.args.limit}
                            for name, folder in [(BASE_MODEL, self.work / "base"),
                                                 *((n, self.ckpt / n) for n in finished)]]}
        path = self.work / "audits.yaml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        t = time.perf_counter()
        for attempt in range(1, 4):  # on a starved machine a worker can miss its start-up timeout: rerun resumes
            out = subprocess.run([CLI, "serve", "--config", str(path), "--once"], cwd=self.work, env=_clean_env(),
                                 capture_output=True, text=True)
            if out.returncode == 0:
                break
            print(f"  serve --once failed (exit {out.returncode}, attempt {attempt} of 3): "
                  f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.stdout[-300:]}", flush=True)
        else:
            sys.exit(f"serve --once failed 3 times:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        secs = time.perf_counter() - t
        print("\n".join(f"  {line}" for line in out.stdout.splitlines() if "audited" in line and " 0 new" not in line)
              + f"\n  serve --once: {secs:.0f}s", flush=True)
        return secs

    def paired(self) -> pl.DataFrame:
        """Each grid run's last checkpoint against step 0, through the paired engine (cached per run)."""
        from pipeline.analysis.paired import paired_comparison, write_comparison
        from pipeline.storage.catalog import open_catalog
        from pipeline.storage.runs import new_run_id
        from pipeline.storage.store import Store

        store = Store(str(self.root))
        cache = self.work / "paired"
        cache.mkdir(exist_ok=True)
        frames, con = [], None
        last = f"step-{self.args.steps:06d}"
        for name in self.grid:
            path = cache / f"{name}.parquet"
            if not path.exists():
                con = con or open_catalog(store)
                t = time.perf_counter()
                frame = paired_comparison(con, (BASE_MODEL, BASE_RELEASE), (name, last),
                                          resamples=self.args.resamples)
                write_comparison(store, new_run_id(), frame)
                frame.write_parquet(path)
                print(f"  paired {name}@{last} vs step 0: {time.perf_counter() - t:.0f}s", flush=True)
            frames.append(pl.read_parquet(path).with_columns(pl.lit(name).alias("run")))
        if con is not None:
            con.close()
        return pl.concat(frames, how="diagonal_relaxed")

    def values(self) -> pl.DataFrame:
        """Every audited (model, release) statistic of the grid, from ``results`` (latest audit of each)."""
        from pipeline.storage.catalog import open_catalog
        from pipeline.storage.store import Store

        con = open_catalog(Store(str(self.root)))
        try:
            return con.sql("""
                select model, release, analysis, probe_set, property, statistic, value
                from results where model like 'imp-%'
                qualify row_number() over (partition by model, release, analysis, probe_set, property, statistic
                                           order by run_id desc) = 1""").pl()
        finally:
            con.close()


def tidy(grid: Grid, paired: pl.DataFrame, results: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``changes`` (per run and statistic, from the paired engine) and ``values`` (per run, step, statistic)."""
    from pipeline.theory.imprint import STATISTICS

    on = ["analysis", "probe_set", "property", "statistic"]
    keys = pl.DataFrame([dict(zip(["key", "label", *on], row, strict=True)) for row in STATISTICS]).drop("label")
    runs = pl.DataFrame([{"run": n, "optimizer": c.optimizer, "arm": c.pairs, "seed": c.seed}
                         for n, c in grid.grid.items()])
    changes = (paired.join(keys, on=on)
               .join(runs, on="run")
               .select("key", "optimizer", "arm", "seed", "base_value", "value", "difference", "ci_low", "ci_high",
                       "n_shared"))
    base = results.filter(pl.col("model") == BASE_MODEL).join(keys, on=on)
    step0 = pl.lit(0, dtype=pl.Int64).alias("step")
    values = [base.join(runs, how="cross").select("key", "optimizer", "arm", "seed", step0, "value")]
    values.append(results.join(keys, on=on)
                  .join(runs, left_on="model", right_on="run")
                  .select("key", "optimizer", "arm", "seed",
                          pl.col("release").str.split("-").list.get(1).cast(pl.Int64).alias("step"), "value"))
    return changes, pl.concat(values)


def fmt(x: float, sign: bool = True) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:+.3f}" if sign else f"{x:.3f}")


def print_table(table: pl.DataFrame) -> None:
    print("| statistic | optimizer | step 0 | last, semantic | change, semantic [95% t, seeds] | seeds whose "
          "paired CI excludes 0 | change, shuffled [95% t] | semantic − shuffled [Welch 95%] |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table.iter_rows(named=True):
        print(f"| {r['statistic']} | {r['optimizer']} | {fmt(r['step0'], False)} | {fmt(r['semantic_last'], False)} "
              f"| {fmt(r['semantic_change'])} [{fmt(r['semantic_low'])}, {fmt(r['semantic_high'])}] "
              f"| {r['semantic_seeds_differ']}/{r['semantic_seeds']} sem, "
              f"{r['shuffled_seeds_differ']}/{r['shuffled_seeds']} shuf "
              f"| {fmt(r['shuffled_change'])} [{fmt(r['shuffled_low'])}, {fmt(r['shuffled_high'])}] "
              f"| {fmt(r['semantic_minus_shuffled'])} [{fmt(r['sms_low'])}, {fmt(r['sms_high'])}] |")


def equilibrium_report(grid: Grid) -> dict:
    """The formula against persistence in the equilibrium runs: whole run and after a 3-tau burn-in, with the
    quantities that say why (lambda_eff, how far the norms still move, how far the heat drifts)."""
    import numpy as np

    from pipeline.storage.store import Store
    from pipeline.theory.trace_formula import per_step_terms, read_trace, score_formula

    store = Store(str(grid.root))
    out = {}
    print("\n| run | eta | lambda | 1/(2 eta lambda) | window | formula R² | persistence R² | integrated R² | "
          "formula Spearman | persistence Spearman | predicted/observed | lambda_eff median | "
          "norm moved in window | heat 2nd/1st half |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, cfg in grid.equilibrium.items():
        trace = read_trace(store, name)
        for start in (0, 3 * grid.tau):
            scores = score_formula(trace, cfg.weight_decay, start)
            first, mid, last = scores["window"]
            terms = per_step_terms(trace.filter(pl.col("step") >= start), cfg.weight_decay)
            halves = terms.with_columns((pl.col("step") >= mid).alias("second")).group_by("item_id", "second").agg(
                pl.col("h").mean())
            heat = halves.pivot(on="second", index="item_id", values="h")
            heat_ratio = float(np.median(heat["true"].to_numpy() / heat["false"].to_numpy()))
            norms = trace.filter(pl.col("step").is_in([first, last])).pivot(on="step", index="item_id",
                                                                             values="norm")
            moved = float(np.median(np.abs(norms[str(last)] / norms[str(first)] - 1)))
            s2 = scores["second_half"]
            row = {"window": [first, mid, last], "formula": s2["formula"], "persistence": s2["persistence"],
                   "integrated": s2["integrated"], "heat_only": s2["heat_only"],
                   "lambda_eff_median": scores["lambda_eff_median"], "norm_moved": moved, "heat_ratio": heat_ratio}
            out[f"{name}@{start}"] = row
            print(f"| {name} | {cfg.lr:g} | {cfg.weight_decay:.4g} | {1 / (2 * cfg.lr * cfg.weight_decay):.0f} "
                  f"| {first}-{mid - 1} → {mid}-{last} | {fmt(s2['formula']['r2'])} | "
                  f"{fmt(s2['persistence']['r2'])} | {fmt(s2['integrated']['r2'])} | "
                  f"{fmt(s2['formula']['spearman'])} | {fmt(s2['persistence']['spearman'])} | "
                  f"{s2['formula']['ratio_median']:.3g} | {scores['lambda_eff_median']:+.3g} | {moved:.1%} | "
                  f"{heat_ratio:.3g} |")
    return out


def default_finetune(work: Path) -> None:
    """The README's default fine-tune from the command line; its output has the trace's share of wall time."""
    folder = work / "default"
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "output.txt").exists():
        print((folder / "output.txt").read_text())
        return
    t = time.perf_counter()
    out = subprocess.run([CLI, "theory", "finetune", "--model", "minilm-l6", "--optimizer", "adamw"], cwd=folder,
                         env=_clean_env(), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"theory finetune failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    text = out.stdout + f"\n(command wall time, measured by the benchmark: {time.perf_counter() - t:.0f}s)\n"
    (folder / "output.txt").write_text(text)
    print(text)


def trace_cost(model: str, reps: int) -> None:
    """The 450-item trace sample (300 nouns, 150 definitions: the default until issue 28) embedded the old way
    (batches of 128 in sample order, tokenized each time) and by :class:`~pipeline.theory.trace.TraceEncoder`,
    interleaved, in this process: CPU seconds, padded tokens, ratio."""
    import numpy as np
    import torch

    from pipeline.theory.finetune import load_model
    from pipeline.theory.trace import TraceEncoder, pre_normalize_modules, trace_sample

    torch.set_num_threads(1)  # CPU seconds of one thread: comparable on a shared machine
    st = load_model(FinetuneConfig(model=model), "cpu")
    texts = trace_sample(300, 150, 0)["text"].to_list()

    def old() -> np.ndarray:  # issue 20's computation
        out = []
        st.eval()
        with torch.no_grad():
            for lo in range(0, len(texts), 128):
                features = st.preprocess(texts[lo:lo + 128])
                for module in pre_normalize_modules(st):
                    features = module(features)
                out.append(features["sentence_embedding"].float().numpy())
        st.train()
        return np.concatenate(out)

    encoder = TraceEncoder(st, texts)
    lengths = st.preprocess(texts)["attention_mask"].sum(1).numpy()
    old_tokens = sum(len(lengths[i:i + 128]) * lengths[i:i + 128].max() for i in range(0, len(texts), 128))
    times = {"old": [], "new": []}
    for _ in range(reps):
        for name, fn in (("old", old), ("new", encoder.vectors)):
            t = time.process_time()
            vectors = fn()
            times[name].append(time.process_time() - t)
            norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
            if name == "old":
                reference = norms
    worst = float(np.max(np.abs(norms / reference - 1)))
    o, n = np.median(times["old"]), np.median(times["new"])
    print(f"trace of 450 items, CPU s (1 thread, median of {reps}): old {o:.2f}, new {n:.2f}, new/old {n / o:.2f}; "
          f"padded tokens old {old_tokens:,}, new {encoder.padded_tokens:,} (real {int(lengths.sum()):,}); "
          f"largest relative norm difference {worst:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="folder for checkpoints, the root and the outputs (reused)")
    ap.add_argument("--img", help="folder for the figures (e.g. docs/img)")
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-seq-length", type=int, default=32)
    ap.add_argument("--limit", type=int, default=1200, help="items of each probe set audited per checkpoint")
    ap.add_argument("--resamples", type=int, default=200, help="paired bootstrap resamples")
    ap.add_argument("--jobs", type=int, default=3, help="fine-tunes at a time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per fine-tune")
    ap.add_argument("--mid", action="store_true", help="also checkpoint and audit the middle step")
    ap.add_argument("--equilibrium-steps", type=int, default=180, help="0: no equilibrium runs")
    ap.add_argument("--equilibrium-nouns", type=int, default=60)
    ap.add_argument("--equilibrium-definitions", type=int, default=30)
    ap.add_argument("--default-finetune", action="store_true", help="also time the README's default fine-tune")
    ap.add_argument("--trace-cost", type=int, metavar="REPS", help="only compare the old and new trace, REPS times")
    args = ap.parse_args()
    if args.trace_cost:
        trace_cost(args.model, args.trace_cost)
        return
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    grid = Grid(args)
    grid.work.mkdir(parents=True, exist_ok=True)
    stamp = grid.work / "started"  # the first invocation's start: a resumed grid reports its whole wall time
    if not stamp.exists():
        stamp.write_text(f"{time.time()}\n")
    started = float(stamp.read_text())
    wall: dict[str, float] = {}
    print(f"grid: {len(grid.grid)} runs ({args.seeds} seeds x {OPTIMIZERS} x {ARMS}), {args.steps} steps, batch "
          f"{args.batch_size}, max_seq_length {args.max_seq_length}; audits on {args.limit} items of {PROBES}; "
          f"equilibrium runs: {list(grid.equilibrium)} ({args.equilibrium_steps} steps, tau {grid.tau})", flush=True)
    t = time.perf_counter()
    every, wall["audits (serve --once, during training)"] = grid.train_and_audit()
    wall["training and audits"] = time.perf_counter() - t
    summaries = {n: every[n] for n in grid.grid}
    eq_summaries = {n: every[n] for n in grid.equilibrium}
    t = time.perf_counter()
    paired = grid.paired()
    wall["paired comparisons"] = time.perf_counter() - t
    from pipeline.theory.imprint import STATISTICS, imprint_figure, seed_table

    changes, values = tidy(grid, paired, grid.values())
    table = seed_table(changes)
    print(f"\n## Imprint: {args.seeds} seeds x {{adamw, sgd}} x {{semantic, shuffled}}, {args.steps} steps "
          f"(change = last - step 0, paired engine per run; intervals: t over seeds; Welch for the difference)\n")
    print_table(table)
    eq = equilibrium_report(grid) if grid.equilibrium else {}
    for name, s in eq_summaries.items():
        if "seconds" in s:
            sec = s["seconds"]
            print(f"{name}: trace {sec['trace']:.0f}s of {sec['total']:.0f}s ({sec['trace'] / sec['total']:.0%}), "
                  f"{s['trace_tokens']:,} padded tokens a traced step; decayed {s['decay_parameters']}")
    train_s = sorted(s["seconds"]["total"] for s in summaries.values() if "seconds" in s)
    if train_s:
        print(f"\ngrid runs with their seconds recorded: {len(train_s)} of {len(summaries)}, wall seconds each: "
              f"median {train_s[len(train_s) // 2]:.0f} ({args.jobs} at a time)")
    print("wall of this invocation: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in wall.items()))
    print(f"wall since the grid's first start: {(time.time() - started) / 60:.1f} min")
    if args.img:
        img = Path(args.img)
        img.mkdir(parents=True, exist_ok=True)
        for key, label, *_ in STATISTICS:
            (img / f"imprint_{key}.png").write_bytes(imprint_figure(values, key, label))
        print(f"figures: {img}/imprint_*.png")
    (grid.work / "imprint.json").write_text(json.dumps(
        {"args": vars(args), "table": table.to_dicts(), "changes": changes.to_dicts(), "equilibrium": eq,
         "wall_s": wall, "since_first_start_s": time.time() - started,
         "train_s": {n: s.get("seconds") for n, s in {**summaries, **eq_summaries}.items()}},
        indent=1, default=str))
    if args.default_finetune:
        default_finetune(grid.work)


if __name__ == "__main__":
    main()
