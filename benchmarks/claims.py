"""Issue 34: the paper's claims decided on real data for both built-in models; writes docs/findings.md.

Audits ``minilm-l6`` and ``mpnet-base`` with the installed CLI, as a user would (a subprocess, no
PREFECT_API_URL), on the whole of wordnet-nouns, wordnet-pairs, chaosnli-snli, chaosnli-mnli,
brysbaert-concreteness, cranfield and wordnet-reverse-dictionary (no ``--limit``):

    normaudit audit --model MODEL --probes wordnet-nouns --probes wordnet-pairs ... --root ROOT

then reads each audit's claims table (view ``claims``), runs the paired comparison of every claim test between
the two models on the same resamples (``pipeline.analysis.claims.paired_claims``: mpnet - minilm), counts the
results rows without an interval, and writes the findings page: per claim, both models' tests with their
intervals, n, Holm-adjusted p and evidence, the paired differences, the verdicts, and what each means for a
user of these models. Embeddings already committed under ROOT are reused (the audit resumes), so a rerun
costs the analyses only.

    python benchmarks/claims.py [--root DIR] [--out docs/findings.md] [--models minilm-l6 mpnet-base]
                                [--resamples 1000]

Needs mpnet-base's five PyPI pieces (README, "Compare two models") and the user's copies of the ChaosNLI,
concreteness and Cranfield data (``normaudit probes list`` shows which sets are available; ``probes add``
stores your copy). Sized for a 2-core CPU: the embeddings take about an hour there (mpnet most of it), a
rerun over stored embeddings a few minutes; on a GPU machine the same command takes minutes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from pipeline.analysis.claims import CLAIMS, p_text, paired_claims, test_text
from pipeline.analysis.sql import DEFAULT_PARAMS
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store

REPO = Path(__file__).resolve().parent.parent
SETS = ("wordnet-nouns", "wordnet-pairs", "chaosnli-snli", "chaosnli-mnli", "brysbaert-concreteness", "cranfield",
        "wordnet-reverse-dictionary")
CLAIM_TITLES = {
    "specificity": "Specificity: do more specific concepts get longer vectors?",
    "frequency": "Frequency: do frequent words get shorter vectors?",
    "human_uncertainty": "Human uncertainty: do items people disagree on get shorter vectors?",
    "retrieval_calibration": "Retrieval calibration: does the query's norm say whether it will be answered?",
}


def audit(model: str, root: str, log: Path) -> tuple[float, int]:
    """Run the CLI's audit of every set; returns (wall seconds, exit code). Output goes to ``log``."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.setdefault("COLUMNS", "220")
    cli = Path(sys.executable).parent / "normaudit"
    args = [str(cli), "audit", "--model", model, *(a for s in SETS for a in ("--probes", s)), "--root", root]
    t = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT, check=False, cwd=os.getcwd())
    return time.perf_counter() - t, done.returncode


def _ci(value, low, high, digits: int = 3) -> str:
    if value is None:
        return "—"
    text = f"{value:+.{digits}f}"
    return text if low is None else f"{text} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a '|' (as in ρ(norm, x | controls)) would end the cell."""
    return text.replace("|", "\\|")


def _test_name(row: dict) -> str:
    return _cell(f"{test_text(row)}, claimed {row['direction']} vs {row['null_value']:g}")


def _size(rows: pl.DataFrame) -> str:
    """The largest effect among a model's tests of a claim, in words that say how large it is."""
    effect = (rows["value"] - rows["null_value"]).abs()
    top = rows.row(int(effect.arg_max()), named=True)
    size = abs(top["value"] - top["null_value"])
    word = "weak" if size < 0.1 else "modest" if size < 0.3 else "strong"
    return f"the largest effect is {test_text(top)} = {top['value']:+.3f} ({word}: {size:.3f} from its null)"


def _meaning(claim: str, verdicts: dict[str, str], part: pl.DataFrame) -> str:
    """One sentence per model saying what its verdict means for a user, and no more."""
    parts = []
    for model, v in verdicts.items():
        rows = part.filter(pl.col("model") == model)
        if not rows.height:
            continue
        if v == "supported":
            parts.append(f"in {model} the norm carries this signal in the claimed direction on the populations "
                         "listed (at least one test beyond chance after Holm, none against)")
        elif v == "contradicted":
            parts.append(f"in {model} the norm relates to it in the opposite direction to the claim on the "
                         "populations listed")
        elif v == "mixed":
            parts.append(f"in {model} the tests disagree in sign (some beyond chance each way): no single "
                         "direction holds across the populations listed")
        else:
            parts.append(f"in {model} no test is beyond chance after Holm: the norm cannot be read as this signal "
                         "on these data")
        parts[-1] += f"; {_size(rows)}"
    return "; ".join(parts) + "."


def _raw_zipf(con, run_id: str) -> dict | None:
    rows = con.sql("select value, ci_low, ci_high, n from results where run_id = $r and analysis = 'norm_vs_property' "
                   "and probe_set = 'wordnet-nouns' and property = 'zipf' and statistic = 'spearman'",
                   params={"r": run_id}).pl()
    return rows.row(0, named=True) if rows.height else None


def findings(con, runs: dict[str, dict], paired: pl.DataFrame, nulls: pl.DataFrame, walls: dict[str, float],
             command: str) -> str:
    """The text of docs/findings.md."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    lines = [
        "# Findings: the paper's claims on both built-in models",
        "",
        f"Produced by `{command}` on {dt.date.today():%Y-%m-%d}, commit {commit}, on {cpu} "
        f"({os.cpu_count()} CPUs). Every number below is in the `claims`, `results` and paired tables this run "
        "stored; each interval is a 95% bootstrap percentile interval (1,000 seeded Poisson resamples of the "
        "units n counts) unless the row names the Wilson score interval (hypernym shares). The verdict rule, "
        "written before any of these numbers were seen, is in [analyses.md](analyses.md#the-claims-table): a "
        "test supports (contradicts) its claim when its Holm-adjusted p within the claim is below 0.05 on the "
        "claimed (other) side of the null; a claim is supported when one test supports it and none contradicts.",
        "",
        ("Audit wall times (CLI, embeddings reused where already stored under the root): "
         + ", ".join(f"{m} {s:,.0f} s" for m, s in walls.items()) + "." if walls else
         "The audits below were already stored under the root (`--skip-audits`)."),
        "",
        "| model | release | run |",
        "|---|---|---|",
        *(f"| {m} | {r['release']} | {r['run_id']} |" for m, r in runs.items()),
        "",
    ]
    claims = pl.concat([r["claims"] for r in runs.values()])
    for claim in CLAIMS:
        part = claims.filter(pl.col("claim") == claim)
        if not part.height:
            continue
        verdicts = {m: (p["verdict"][0] if (p := part.filter(pl.col("model") == m)).height else "not tested")
                    for m in runs}
        lines += [f"## {CLAIM_TITLES[claim]}", "",
                  "Verdict: " + "; ".join(f"**{m}: {v}**" for m, v in verdicts.items()) + ".", "",
                  "| model | population | test | value [95% CI] | n | p (Holm) | evidence |",
                  "|---|---|---|---|---|---|---|"]
        for row in part.sort(["probe_set", "property", "statistic", "model"]).iter_rows(named=True):
            lines.append(f"| {row['model']} | {row['population']} | {_test_name(row)} | "
                         f"{_ci(row['value'], row['ci_low'], row['ci_high'])} | {row['n']:,} | "
                         f"{p_text(row['p_holm'], row['n_resamples'])} | {row['evidence']} |")
        pairs = paired.filter(pl.col("claim") == claim)
        if pairs.height:
            base, other = pairs["base_model"][0], pairs["model"][0]
            lines += ["", f"Paired difference ({other} − {base}, same units and resamples on both sides):", "",
                      f"| test | {base} | {other} | difference [95% CI] | n |", "|---|---|---|---|---|"]
            for row in pairs.sort(["probe_set", "property", "statistic"]).iter_rows(named=True):
                name = _cell(f"{row['probe_set']}: {test_text(row)}")
                lines.append(f"| {name} | {row['base_value']:+.3f} | {row['value']:+.3f} | "
                             f"{_ci(row['difference'], row['ci_low'], row['ci_high'])} | {row['n']:,} |")
        if claim == "frequency":  # the raw relation, which the length control changes (context, not a test)
            raw = [f"{m}: {_ci(r['value'], r['ci_low'], r['ci_high'])} (n = {r['n']:,})" for m in runs
                   if (r := _raw_zipf(con, runs[m]["run_id"]))]
            if raw:
                lines += ["", "Context, not a test: ρ(norm, zipf) on wordnet-nouns without any control: "
                          + "; ".join(raw) + "."]
        if claim == "retrieval_calibration":  # the rule for "adds" (docs/analyses.md): the gain's interval above 0
            gains = part.filter((pl.col("statistic") == "cv_auroc_gain_query_norm") & (pl.col("ci_low") > 0))
            adds = [f"{m}: {'yes' if m in gains['model'].to_list() else 'no'}" for m in runs]
            lines += ["", "Does the norm add to top-1 cosine (a cross-validated gain whose interval lies above 0 in "
                      "some set)? " + "; ".join(adds) + "."]
        lines += ["", "What it means for a user: " + _meaning(claim, verdicts, part), ""]
    controls = sorted({(r["claim"], r["probe_set"], r["controls"] or "none")
                       for r in claims.filter(pl.col("claim") == "human_uncertainty").iter_rows(named=True)})
    if controls:
        lines += ["## Controls used for human uncertainty", "",
                  *(f"- {p}: {c}" for _, p, c in controls),
                  "- ChaosNLI: only the `pair` items (premise and hypothesis together) are counted, one per "
                  "annotated pair; they have no word frequency, so length (token count) is the control.", ""]
    lines += ["## Intervals", "",
              f"Rows of `results` without an interval (other than `norm_by_bin`'s bin summaries) in these runs: "
              f"{nulls.height}." + ("" if not nulls.height else " They are: " + ", ".join(
                  f"{r['analysis']}/{r['probe_set']}/{r['property']}/{r['statistic']}"
                  for r in nulls.iter_rows(named=True)) + "."), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="claims-data", help="storage root (embeddings there are reused)")
    parser.add_argument("--out", default=str(REPO / "docs" / "findings.md"))
    parser.add_argument("--models", nargs=2, default=["minilm-l6", "mpnet-base"], metavar=("BASE", "OTHER"))
    parser.add_argument("--resamples", type=int, default=DEFAULT_PARAMS["resamples"])
    parser.add_argument("--skip-audits", action="store_true",
                        help="write the page from the latest finished audits already stored under --root")
    args = parser.parse_args()
    root = str(Path(args.root).resolve()) if "://" not in args.root else args.root
    # the root is this machine's folder: the page names the flag, not the path
    command = "python benchmarks/claims.py" + (" --root DIR" if args.root != "claims-data" else "") + (
        f" --resamples {args.resamples}" if args.resamples != DEFAULT_PARAMS["resamples"] else "")
    walls = {}
    for model in [] if args.skip_audits else args.models:
        log = Path(root if "://" not in root else ".") / f"claims-{model}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        seconds, code = audit(model, root, log)
        print(f"{model}: audit {seconds:,.0f} s, exit {code} (log {log})", flush=True)
        if code not in (0, 3):  # 3: an alert; the audit itself is stored
            sys.exit(f"the {model} audit failed (exit {code}); its output is in {log}")
        walls[model] = seconds
    con = open_catalog(open_store(load_settings(root=root)))
    runs = {}
    for model in args.models:
        run = con.execute("select run_id, release from runs where model = $m and status in ('completed', 'alerted') "
                          "order by run_id desc limit 1", {"m": model}).fetchall()[0]
        claims = con.sql("select * from claims where run_id = $r", params={"r": run[0]}).pl()
        runs[model] = {"run_id": run[0], "release": run[1], "claims": claims}
    t = time.perf_counter()
    paired = paired_claims(con, (args.models[0], runs[args.models[0]]["release"]),
                           (args.models[1], runs[args.models[1]]["release"]), DEFAULT_PARAMS["seed"], args.resamples)
    print(f"paired claims: {time.perf_counter() - t:,.0f} s", flush=True)
    nulls = con.sql("select analysis, probe_set, property, statistic from results where ci_low is null "
                    "and analysis <> 'norm_by_bin' and run_id in (select unnest($r)) order by all",
                    params={"r": [r["run_id"] for r in runs.values()]}).pl()
    text = findings(con, runs, paired, nulls, walls, command)
    Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
