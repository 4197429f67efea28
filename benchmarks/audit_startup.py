"""Wall time of the small demo-sized audit: 300 words, the tiny test model, the installed CLI.

Run:  python benchmarks/audit_startup.py [--runs 5] [--words 300] [--workers N] [--keep DIR]

Each run is ``normaudit audit --model TINY --probes WORDS.csv --root FRESH --release r --timings`` in a
subprocess, as a user starts it: no ``PREFECT_API_URL`` (the CLI starts its temporary Prefect API and
its local Dask cluster), a fresh data root per run. All runs share one Prefect home, created for the
benchmark; one unmeasured warm-up run creates its database first, as on a machine that has run Prefect
before (a first ever run also creates the database: a few seconds more).

Prints each run's wall time (from the start of the command to its exit, including the close of the
local cluster and of the API), the median, and each run's phases as ``--timings`` printed them.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.builders import build_tiny_model  # noqa: E402 - the repository root is put on the path first

VOCAB = ["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table", "music", "water"]


def write_words(path: Path, n: int) -> Path:
    """``n`` probe items of one to six words each, with a ``zipf`` property (deterministic)."""
    import random

    rng = random.Random(3)
    lines = ["item_id,text,zipf"]
    for i in range(n):
        text = " ".join(rng.choice(VOCAB) for _ in range(1 + i % 6))
        lines.append(f"w{i:04d},{text},{rng.uniform(1, 7):.2f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def phases(stdout: str) -> dict[str, float]:
    """The rows of the ``timings (s)`` table the CLI prints with ``--timings``."""
    found = {}
    after = stdout.split("timings (s)", 1)[-1] if "timings (s)" in stdout else ""
    for line in after.splitlines():
        m = re.match(r"\s*[│|]?\s*([A-Za-z_][\w .:/-]*?)\s*[│|]\s*([0-9.]+)\s*[│|]?\s*$", line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def run_once(cli: Path, model: Path, words: Path, root: Path, env: dict, workers: int | None) -> tuple[float, str]:
    cmd = [str(cli), "audit", "--model", str(model), "--probes", str(words), "--root", str(root),
           "--release", "r", "--timings"]
    if workers:
        cmd += ["--workers", str(workers)]
    started = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"the audit failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return wall, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--workers", type=int, default=None, help="--workers of the audit (default: its own)")
    parser.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    args = parser.parse_args()
    cli = Path(sys.executable).parent / "normaudit"
    with tempfile.TemporaryDirectory(prefix="audit-startup-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model = work / "tiny"
        if not (model / "config.json").exists():
            build_tiny_model(model)
        words = write_words(work / "words.csv", args.words)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env["PREFECT_HOME"] = str(work / "prefect-home")
        wall, _ = run_once(cli, model, words, work / "root-warmup", env, args.workers)
        print(f"warm-up (creates the Prefect database): {wall:.2f} s")
        walls = []
        for i in range(args.runs):
            wall, stdout = run_once(cli, model, words, work / f"root-{i}", env, args.workers)
            walls.append(wall)
            steps = " ".join(f"{k}={v:.2f}" for k, v in phases(stdout).items())
            print(f"run {i + 1}: {wall:.2f} s  {steps}", flush=True)
        print(f"median of {len(walls)}: {statistics.median(walls):.2f} s "
              f"(min {min(walls):.2f}, max {max(walls):.2f}); {args.words} words, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
