"""Issue 35: the norm formula tested where its assumptions hold, across settings, against honest baselines.

Run:  nice -n 10 python benchmarks/formula.py [--work DIR] [--pairs 2000] [--measured 200] [--lrs 0.1,0.3,0.9]
          [--decays 0.003,0.01,0.03] [--seeds 3] [--relax 10] [--window 4] [--encoder-runs NAMES]
          [--encoder-batch 8] [--max-seq-length 32] [--trace-nouns 60] [--trace-definitions 30] [--boot 1000]

1. **Frozen features** (``pipeline.theory.frozen_head``): MiniLM's raw pooled vectors of ``--pairs`` reverse-dictionary
   train pairs (definition, lemma), computed once and cached in DIR; a linear head (64 × 384) trained on them with
   symmetric InfoNCE and plain SGD with weight decay, for every learning rate × decay × seed: ``--relax``/(ηλ) steps
   of burn-in, then ``--window``/(ηλ) steps (at least 400) measured at every step on ``--measured`` items (half
   definitions, half lemmas). The window's first half gives each item's d and h, its second half the norms they are
   scored against; beside the formula, the baselines of ``pipeline.theory.baselines``. Per setting: means over seeds
   with t intervals, and formula − baseline paired by seed. Across runs: the slope of log r on log(ηh/λ) (the
   formula: ¼), and the same slope for the formula's own predictions.
2. **Real-encoder runs** (``theory finetune``'s training, traced every step, each parameter's norm recorded every
   step by ``pipeline.theory.rotational``): ``ft-adamw`` and ``ft-sgd`` are the README fine-tune's optimizer
   settings (λ 0.01, the trainer's decay groups, 150 steps); ``eq-adamw`` and ``rot-sgd`` are issue 28's
   equilibrium runs (every parameter decayed, λ = 1/(2ητ), τ = 30, 180 steps); ``rot-adamw`` is the same with
   AdamW at η 2e-3, where Kosson et al.'s equilibrium norm lies within a few τ of the pretrained weights'. On each
   trace the formula, its forecast, the balance corrected for h = c r^k and the baselines are scored (bootstrap
   intervals over items: one run each); per module, the norm against its rotational equilibrium.

Everything goes under DIR (default ./formula-work); the numbers to DIR/formula.json. Stages already done (the
features, a finished encoder run's trace and module norms) are reused on a rerun.

The defaults are sized for a shared 2-core CPU: 34.4 min wall on 2026-12-04 at load average 3–6 (the head grid
and the features 18 min beside the encoder runs, 4–10 min each, one at a time). On a GPU machine, larger:
``--pairs 10000 --measured 1000 --seeds 5 --lrs 0.05,0.1,0.3,0.9 --decays 0.003,0.01,0.03 --window 8
--encoder-batch 32 --max-seq-length 64 --trace-nouns 300 --trace-definitions 150 --jobs 1 --threads 4``. The
head grid runs on the CPU either way (tiny matrices: 1.15 ms a step in a probe with 200 items; those flags mean
about 1.4 million steps with 1,000 items, an hour or more; not run); the encoder runs use the GPU through the
trainer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.theory.baselines import BASELINES, METRICS, baseline_predictions, seed_summary  # noqa: E402
from pipeline.theory.estimators import score  # noqa: E402
from pipeline.theory.power_laws import fit_exponent, fit_heat_power  # noqa: E402

TAU = 30  # relaxation time 1/(2 eta lambda) of the equilibrium runs, in steps (issue 28)
ENCODER_RUNS = {  # name: optimizer, lr, weight decay (None: 1/(2 eta TAU)), decay every parameter, steps
    "ft-adamw": ("adamw", 5e-5, 0.01, False, 150),
    "ft-sgd": ("sgd", 0.05, 0.01, False, 150),
    "eq-adamw": ("adamw", 5e-5, None, True, 180),
    "rot-adamw": ("adamw", 2e-3, None, True, 180),
    "rot-sgd": ("sgd", 0.05, None, True, 180),
}
HEAD_PREDICTIONS = ("formula", "heat_only", *BASELINES)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _ci(v: list[float], fmt: str = "+.3f") -> str:
    mean, lo, hi = v
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


# ---------------------------------------------------------------- real encoder (worker processes)

def encoder_config(name: str, args: argparse.Namespace, work: Path):
    from pipeline.theory.finetune import FinetuneConfig

    optimizer, lr, wd, decay_norms, steps = ENCODER_RUNS[name]
    steps = args.encoder_steps or steps
    return FinetuneConfig(
        optimizer=optimizer, learning_rate=lr, weight_decay=wd if wd is not None else 1 / (2 * lr * TAU),
        decay_norms=decay_norms, steps=steps, batch_size=args.encoder_batch, max_seq_length=args.max_seq_length,
        checkpoint_every=steps, trace_every=1, trace_nouns=args.trace_nouns,
        trace_definitions=args.trace_definitions, seed=0, run=name, out=str(work / "checkpoints" / name))


def train_encoder(job: tuple[str, str, str, int]) -> dict:
    """One traced fine-tune with every parameter's norm recorded; writes DIR/modules/NAME.parquet."""
    cfg_json, root, modules_path, threads = job
    import shutil

    from pipeline.settings import load_settings
    from pipeline.storage.store import Store
    from pipeline.theory.finetune import FinetuneConfig, finetune
    from pipeline.theory.rotational import module_norm_recorder

    cfg = FinetuneConfig.model_validate_json(cfg_json)
    recorder = module_norm_recorder()
    summary = finetune(load_settings(root=root, threads_per_worker=threads), Store(root), cfg, f"formula-{cfg.label()}",
                       callbacks=(recorder,))
    recorder.frame().write_parquet(modules_path)
    shutil.rmtree(cfg.checkpoint_folder(), ignore_errors=True)  # 2 x 90 MB a run that nothing here reads
    return summary


def start_encoder_runs(args: argparse.Namespace, work: Path):
    """Submit every encoder run without module norms on disk; returns the pool and the futures by name."""
    import shutil

    root = work / "normaudit-data"
    (work / "modules").mkdir(parents=True, exist_ok=True)
    todo = {}
    for name in args.encoder_runs:
        if (work / "modules" / f"{name}.parquet").exists():
            continue
        cfg = encoder_config(name, args, work)
        shutil.rmtree(cfg.checkpoint_folder(), ignore_errors=True)  # a half-finished run starts again
        shutil.rmtree(root / "training_trace" / name, ignore_errors=True)
        todo[name] = cfg
    if not todo:
        return None, {}
    pool = ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn"))
    futures = {name: pool.submit(train_encoder, (cfg.model_dump_json(), str(root),
                                                 str(work / "modules" / f"{name}.parquet"), args.threads))
               for name, cfg in todo.items()}
    print(f"encoder runs started in the background ({args.jobs} at a time): {', '.join(todo)}", flush=True)
    return pool, futures


# ---------------------------------------------------------------- frozen features and the head grid

def features(args: argparse.Namespace, work: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Cached MiniLM features of ``--pairs`` train pairs, and the measured items (half definitions, half lemmas)."""
    path = work / f"features-{args.pairs}.npz"
    if not path.exists():
        from pipeline.probes.splits import reverse_dictionary_pairs
        from pipeline.theory.finetune import FinetuneConfig, load_model
        from pipeline.theory.frozen_head import head_features

        t = time.perf_counter()
        model = load_model(FinetuneConfig(), "cpu")
        defs, lems, words = head_features(model, reverse_dictionary_pairs("train"), args.pairs, seed=0)
        np.savez(path, defs=defs, lems=lems, words=np.array(words))
        print(f"features: {args.pairs} pairs embedded in {time.perf_counter() - t:.0f}s -> {path}", flush=True)
    data = np.load(path)
    defs, lems = data["defs"].astype(np.float64), data["lems"].astype(np.float64)
    pick = np.random.default_rng(1).choice(args.pairs, args.measured // 2, replace=False)
    measured = np.concatenate([defs[pick], lems[pick]])
    info = {"pairs": args.pairs, "measured": measured.shape[0], "feature_norm_median": float(
        np.median(np.linalg.norm(np.concatenate([defs, lems]), axis=1)))}
    return defs, lems, measured, info


def head_grid(args: argparse.Namespace, defs, lems, measured) -> list[dict]:
    """Every run of the grid: scores of the formula and the baselines, and the points of the exponent fit."""
    from pipeline.theory.frozen_head import HeadRun, train_head

    runs = []
    for lr in args.lrs:
        for wd in args.decays:
            for seed in range(args.seeds):
                run = HeadRun(lr=lr, weight_decay=wd, seed=seed, relax=args.relax, window=args.window)
                t = time.perf_counter()
                out = train_head(defs, lems, measured, run)
                first, half = out["first"], run.window_steps // 2
                observed = out["norms"][half:].mean(0)
                preds = {"formula": first.predicted_norm(),
                         "heat_only": first.predicted_norm(d=np.zeros_like(first.d)),
                         **baseline_predictions(out["norms"][:half], out["steps"][:half], out["steps"][half:],
                                                lr, wd)}
                k, _ = fit_heat_power(out["r_before"], out["heat"])
                runs.append({
                    "lr": lr, "weight_decay": wd, "seed": seed, "steps": run.steps, "burn_in": run.burn_in,
                    "window": run.window_steps, "loss": out["loss"], "w_norm": out["w_norm"],
                    "scores": {name: score(p, observed) for name, p in preds.items()},
                    "ratio_median": float(np.median(preds["formula"] / observed)),
                    "lambda_eff_over_lambda": float(np.median(first.lambda_eff / wd)),
                    "log_heat_x": float(np.mean(np.log(lr * first.h / wd))),
                    "log_norm": float(np.mean(np.log(observed))),
                    "log_norm_formula": float(np.mean(np.log(preds["formula"]))),
                    "heat_power_k_median": float(np.nanmedian(k)),
                    "balance": out["balance"], "seconds": time.perf_counter() - t})
                print(f"  head lr {lr:g} wd {wd:g} seed {seed}: {run.steps} steps in {runs[-1]['seconds']:.0f}s, "
                      f"loss {out['loss']:.3f}, formula R2 {runs[-1]['scores']['formula']['r2']:+.3f}", flush=True)
    return runs


def summarize_grid(runs: list[dict]) -> tuple[list[dict], dict]:
    """Per setting: means over seeds with t intervals (:func:`seed_summary`); across runs: the exponent fits."""
    settings = []
    for lr, wd in dict.fromkeys((r["lr"], r["weight_decay"]) for r in runs):
        group = [r for r in runs if (r["lr"], r["weight_decay"]) == (lr, wd)]
        summary = seed_summary([r["scores"] for r in group])
        settings.append({"lr": lr, "weight_decay": wd, "seeds": len(group), "steps": group[0]["steps"],
                         "burn_in": group[0]["burn_in"], "window": group[0]["window"], "summary": summary,
                         "ratio_median": float(np.mean([r["ratio_median"] for r in group])),
                         "lambda_eff_over_lambda": float(np.mean([r["lambda_eff_over_lambda"] for r in group])),
                         "heat_power_k_median": float(np.mean([r["heat_power_k_median"] for r in group])),
                         "holds": {m: all(summary["difference"][b][m][1] > 0 for b in BASELINES) for m in METRICS}})
    x = np.array([r["log_heat_x"] for r in runs])
    exponent = {"observed": fit_exponent(x, np.array([r["log_norm"] for r in runs])),
                "formula": fit_exponent(x, np.array([r["log_norm_formula"] for r in runs])),
                "x_range": [float(x.min()), float(x.max())]}
    return settings, exponent


def print_grid(settings: list[dict], exponent: dict, n_items: int) -> None:
    print(f"\nFrozen-feature head: per setting, mean over seeds [95% t interval]; {n_items} items per run; "
          "target: each item's mean norm over the window's second half")
    print(f"{'lr':>5} {'wd':>6} {'steps':>6} {'prediction':<12} {'R2':>24} {'R2 log':>24} {'Spearman':>24}")
    for s in settings:
        for name in HEAD_PREDICTIONS:
            v = s["summary"][name]
            print(f"{s['lr']:>5g} {s['weight_decay']:>6g} {s['steps']:>6} {name:<12} {_ci(v['r2']):>24} "
                  f"{_ci(v['r2_log']):>24} {_ci(v['spearman']):>24}")
        best = {m: max(BASELINES, key=lambda b: s["summary"][b][m][0]) for m in METRICS}
        diffs = "; ".join(f"{m} − {best[m]} {_ci(s['summary']['difference'][best[m]][m])}" for m in METRICS)
        holds = ", ".join(m for m in METRICS if s["holds"][m]) or "none"
        print(f"{'':>20}formula − best baseline: {diffs}; beats every baseline on: {holds}; "
              f"predicted/observed {s['ratio_median']:.3f}, λ_eff/λ {s['lambda_eff_over_lambda']:.2f}, "
              f"h∝r^k median k {s['heat_power_k_median']:+.2f}")
    e, f = exponent["observed"], exponent["formula"]
    print(f"\nExponent of r in (ηh/λ) across {e['n']} runs (log(ηh/λ) from {exponent['x_range'][0]:.2f} to "
          f"{exponent['x_range'][1]:.2f}): observed {e['slope']:.4f} [{e['lo']:.4f}, {e['hi']:.4f}]; "
          f"the formula's own predictions {f['slope']:.4f} [{f['lo']:.4f}, {f['hi']:.4f}]; theory (d = 0) 0.25")


# ---------------------------------------------------------------- scoring the encoder traces

ENCODER_PREDICTIONS = ("formula", "integrated", "corrected", "corrected_integrated", *BASELINES)


def score_encoder(name: str, args: argparse.Namespace, work: Path) -> dict:
    """The trace's scores with bootstrap intervals over items, the heat's power and the module equilibria."""
    import polars as pl

    from pipeline.storage.store import Store
    from pipeline.theory.baselines import bootstrap_differences
    from pipeline.theory.rotational import module_equilibria
    from pipeline.theory.trace_formula import formula_predictions, read_trace

    cfg = encoder_config(name, args, work)
    trace = read_trace(Store(str(work / "normaudit-data")), name)
    start = min(3 * TAU, cfg.steps // 2) if cfg.decay_norms else 0  # after a burn-in of 3 tau where decay acts
    items, facts = formula_predictions(trace, cfg.weight_decay, start)
    observed = items["second_half"].to_numpy()
    out = {"boot": args.boot, "optimizer": cfg.optimizer, "lr": cfg.lr, "weight_decay": cfg.weight_decay,
           "steps": cfg.steps, "decay_norms": cfg.decay_norms, "window_start": start, **facts,
           "heat_power_k_quartiles": [float(q) for q in np.nanquantile(items["heat_power_k"].to_numpy(),
                                                                       [0.25, 0.5, 0.75])],
           "heat_power_k_below_4": float((items["heat_power_k"].to_numpy() < 4).mean())}
    preds = {p: items[p].to_numpy() for p in ENCODER_PREDICTIONS}
    out["scores"] = {ref: bootstrap_differences({ref: preds[ref], **{b: preds[b] for b in BASELINES}}, observed,
                                                reference=ref, n_boot=args.boot)
                     for ref in ("formula", "integrated", "corrected", "corrected_integrated")}
    fitted = items.filter(pl.col("corrected").is_finite())  # the corrected equilibrium where it exists
    if fitted.height >= 3:
        out["corrected_where_defined"] = {"items": fitted.height, **score(fitted["corrected"].to_numpy(),
                                                                          fitted["second_half"].to_numpy())}
    modules = pl.read_parquet(work / "modules" / f"{name}.parquet")
    third = cfg.steps // 3
    eq = module_equilibria(modules, cfg.optimizer, (third + 1, 2 * third), (2 * third + 1, cfg.steps))
    out["modules"] = eq.to_dicts()
    return out


def module_kind(name: str) -> str:
    """A parameter's role, without its layer number: ``attention.self.query.weight``, ``LayerNorm.bias``, ..."""
    parts = name.split(".")
    if "layer" in parts:
        return ".".join(parts[parts.index("layer") + 2:])
    return ".".join(parts[-2:])


def print_encoder(name: str, res: dict) -> None:
    first, mid, last = res["window"]
    print(f"\n{name}: {res['optimizer']} η {res['lr']:g} λ {res['weight_decay']:.4g} "
          f"({'every parameter decayed' if res['decay_norms'] else 'trainer decay groups'}), {res['steps']} steps, "
          f"1/(2ηλ) {1 / (2 * res['lr'] * res['weight_decay']):,.0f}; steps {first}–{mid - 1} predict {mid}–{last}, "
          f"{res['items']} items, one run: 95% bootstrap intervals over items ({res['boot']} resamples)")
    q = res["heat_power_k_quartiles"]
    print(f"  heat h ∝ r^k per item: k quartiles {q[0]:+.2f} / {q[1]:+.2f} / {q[2]:+.2f}; k < 4 for "
          f"{res['heat_power_k_below_4']:.0%}; corrected balance has a stable fixed point for "
          f"{res['fixed_point_share']:.0%} of items; λ_eff median {res['lambda_eff_median']:+.4g}")
    base = res["scores"]["formula"]
    for b in BASELINES:
        print(f"  {b:<21} R2 {base[b]['r2']:+10.3f}  R2 log {base[b]['r2_log']:+10.3f}  Spearman "
              f"{base[b]['spearman']:+.3f}")
    for ref in ("formula", "integrated", "corrected", "corrected_integrated"):
        s = res["scores"][ref]
        best = {m: max(BASELINES, key=lambda b: s[b][m] if np.isfinite(s[b][m]) else -np.inf) for m in METRICS}
        diffs = "; ".join(f"{m} − {best[m]} {_ci(s['difference'][best[m]][m])}" for m in METRICS)
        print(f"  {ref:<21} R2 {s[ref]['r2']:+10.3f}  R2 log {s[ref]['r2_log']:+10.3f}  Spearman "
              f"{s[ref]['spearman']:+.3f}   vs best baseline: {diffs}")
    if "corrected_where_defined" in res:
        c = res["corrected_where_defined"]
        print(f"  corrected equilibrium on the {c['items']} items that have one: R2 {c['r2']:+.3f}, "
              f"Spearman {c['spearman']:+.3f}")
    mods = res["modules"]
    reached = [m for m in mods if m["reached"]]
    kinds: dict[str, list] = {}
    for m in mods:
        kinds.setdefault(module_kind(m["name"]), []).append(m)
    print(f"  modules: {len(reached)} of {len(mods)} decayed tensors within 10% of their rotational equilibrium "
          f"(terms from steps {res['steps'] // 3 + 1}–{2 * (res['steps'] // 3)}, norm over the last third)")
    for kind, ms in sorted(kinds.items()):
        ratios = np.array([m["ratio"] for m in ms])
        kosson = np.array([m["observed"] / m["kosson"] for m in ms])
        closed = f", to √(ηC/2λ) {np.median(kosson):.3g}" if np.isfinite(kosson).all() else ""
        print(f"    {kind:<34} n {len(ms):>2}  reached {sum(m['reached'] for m in ms):>2}  observed/predicted "
              f"median {np.median(ratios):.3g} (min {ratios.min():.3g}, max {ratios.max():.3g}){closed}; moved "
              f"{np.median([m['moved'] for m in ms]):+.1%} over the last third; radial cos "
              f"{np.median([m['radial_cos'] for m in ms]):+.3f}")


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="formula-work")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--measured", type=int, default=200)
    parser.add_argument("--lrs", type=_floats, default=[0.1, 0.3, 0.9])
    parser.add_argument("--decays", type=_floats, default=[0.003, 0.01, 0.03])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--relax", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--encoder-runs", type=lambda s: [x for x in s.split(",") if x], default=list(ENCODER_RUNS))
    parser.add_argument("--encoder-steps", type=int, default=0, help="steps of every encoder run (0: its own)")
    parser.add_argument("--encoder-batch", type=int, default=8)
    parser.add_argument("--max-seq-length", type=int, default=32)
    parser.add_argument("--trace-nouns", type=int, default=60)
    parser.add_argument("--trace-definitions", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1, help="encoder runs at a time (beside the head grid)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process")
    parser.add_argument("--boot", type=int, default=1000)
    args = parser.parse_args()
    unknown = set(args.encoder_runs) - set(ENCODER_RUNS)
    if unknown:
        parser.error(f"unknown encoder runs {sorted(unknown)}; known: {', '.join(ENCODER_RUNS)}")

    import torch

    t0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    pool, futures = start_encoder_runs(args, work)
    defs, lems, measured, info = features(args, work)
    runs = head_grid(args, defs, lems, measured)
    settings, exponent = summarize_grid(runs)
    result = {"features": info, "head_runs": runs, "settings": settings, "exponent": exponent,
              "args": {k: v for k, v in vars(args).items()}}
    print_grid(settings, exponent, info["measured"])
    head_s = time.perf_counter() - t0
    for name, future in futures.items():
        summary = future.result()
        print(f"  encoder {name}: {summary['seconds']['total']:.0f}s (train {summary['seconds']['train']:.0f}s, "
              f"trace {summary['seconds']['trace']:.0f}s), loss {summary['train_loss']:.3f}", flush=True)
    if pool is not None:
        pool.shutdown()
    result["encoder"] = {}
    for name in args.encoder_runs:
        result["encoder"][name] = score_encoder(name, args, work)
        print_encoder(name, result["encoder"][name])
    result["seconds"] = {"head_grid_and_features": head_s, "total": time.perf_counter() - t0}
    (work / "formula.json").write_text(json.dumps(result, indent=1, default=float))
    print(f"\nwall {time.perf_counter() - t0:.0f}s (head grid and features {head_s:.0f}s); numbers in "
          f"{work / 'formula.json'}")


if __name__ == "__main__":
    main()
