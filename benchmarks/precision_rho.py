"""How much ``--precision bfloat16`` moves the audit's statistics: every ``norm_vs_property`` of a probe set,
float32 vs bfloat16, with the installed CLI on a fresh root.

Run:  python benchmarks/precision_rho.py [--model minilm-l6] [--probes wordnet-nouns] [--root DIR] [--workers 1]
          [--other bfloat16] [--limit N]

Two audits (``normaudit audit --precision float32``, then ``--precision bfloat16``: releases ``<fp12>`` and
``<fp12>-bfloat16``), then every ``norm_vs_property`` statistic (Spearman ρ and the rest, per property) of both
releases side by side with its change, and ``normaudit compare --release <bf16> --against-release <fp32>``, the
paired comparison on the items both embedded (its 95% intervals say whether a change is beyond resampling
noise). The second audit compares itself with the first too (it is the previous release): exit 3 there means
a statistic moved past its alert threshold, which this script reports rather than treats as a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.embedding.precision import default_release  # noqa: E402 - the repo root is on the path now
from pipeline.settings import load_settings  # noqa: E402
from pipeline.storage.catalog import open_catalog  # noqa: E402
from pipeline.storage.store import open_store  # noqa: E402

BIN = Path(sys.executable).parent / "normaudit"


def _run(*args: str, ok=(0,)) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    t = time.perf_counter()
    out = subprocess.run([str(BIN), *args], env=env, capture_output=True, text=True)
    print(f"$ normaudit {' '.join(args)}  -> exit {out.returncode} in {time.perf_counter() - t:.0f} s", flush=True)
    if out.returncode not in ok:
        raise SystemExit(out.stdout + out.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--probes", default="wordnet-nouns")
    ap.add_argument("--root", default=None, help="storage root (default: a fresh temporary folder)")
    ap.add_argument("--workers", default="1")
    ap.add_argument("--other", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--limit", default=None, help="first N items only")
    args = ap.parse_args()
    root = args.root or tempfile.mkdtemp(prefix="normaudit-precision-")
    common = ["--model", args.model, "--probes", args.probes, "--root", root, "--workers", args.workers, "--timings"]
    if args.limit:
        common += ["--limit", args.limit]
    for precision in ("float32", args.other):
        out = _run("audit", *common, "--precision", precision, ok=(0, 3))
        print("\n".join(line for line in out.stdout.splitlines() if "embedding" in line or "embed_" in line))
        if out.returncode == 3:
            print(f"  (the {precision} audit alerted against the previous release: {out.stderr.strip()[-400:]})")

    con = open_catalog(open_store(load_settings(root=root)))
    fingerprint = con.execute("select fingerprint from runs where model = ? limit 1", [args.model]).fetchone()[0]
    base, other = default_release(fingerprint, "float32"), default_release(fingerprint, args.other)
    rows = con.execute(
        """select a.probe_set, a.property, a.statistic, a.value, b.value, b.value - a.value, a.n
           from results a join results b using (analysis, model, probe_set, property, statistic)
           where a.analysis = 'norm_vs_property' and a.model = ? and a.release = ? and b.release = ?
           order by a.probe_set, a.property, a.statistic""", [args.model, base, other]).fetchall()
    if not rows:
        raise SystemExit(f"no norm_vs_property results for both {base} and {other} under {root}")
    print(f"\nnorm_vs_property, {args.model} on {args.probes}: float32 ({base}) vs {args.other} ({other})")
    print(f"{'probe_set':16s} {'property':20s} {'statistic':12s} {'float32':>10s} {args.other:>10s} {'change':>10s}  n")
    def fmt(x) -> str:
        return "—" if x is None else f"{x:+.5f}"

    for ps, prop, stat, a, b, d, n in rows:
        print(f"{ps:16s} {prop:20s} {stat:12s} {fmt(a):>10s} {fmt(b):>10s} {fmt(d):>10s}  {n}")
    changes = [abs(d) for *_, d, _ in rows if d is not None]
    rho = [abs(r[5]) for r in rows if r[5] is not None and "spearman" in r[2].lower()]
    print(f"largest |change| over all {len(changes)} statistics: {max(changes):.5f}"
          + (f"; over the Spearman ρ: {max(rho):.5f}" if rho else ""))
    out = _run("compare", "--model", args.model, "--release", other, "--against-release", base, "--root", root,
               ok=(0, 3))
    print(out.stdout)
    print(f"root: {root}")


if __name__ == "__main__":
    main()
