"""Audit throughput with 1 and 2 local Dask workers (items/s of the embedding phase), MiniLM.

Run:  python benchmarks/worker_scaling.py [--n 20000] [--workers 1 2] [--shard-size 2048]

Each configuration runs a full ``audit_release`` (Prefect + local Dask processes) into its
own temporary root, so nothing is skipped. Reported: embedding-phase items/s (the
``embed_probes`` subflow: cluster work, staging, validation, commits) and whole-audit wall
time, with the ratio against the 1-worker run in the same process. On a machine with an
NVIDIA GPU, the same run with --device cuda also prints the GPU's share of its bf16
matmul rate (measured here with torch).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shard-size", type=int, default=2048)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    from flows.audit import run_audit
    from pipeline.settings import load_settings

    print(f"machine: {os.cpu_count()} cores; words: first {args.n} of wordnet-nouns; model minilm-l6")
    base = None
    for n_workers in args.workers:
        with tempfile.TemporaryDirectory() as root:
            overrides = {"root": root, "n_workers": n_workers, "shard_size": args.shard_size,
                         "device": args.device}
            t = time.perf_counter()
            summary = run_audit(load_settings(**overrides), "minilm-l6", ["wordnet-nouns"], limit=args.n,
                                timings=True)
            wall = time.perf_counter() - t
        items = sum(summary.embedded_items.values())
        embedding = summary.timings["embed_probes"].seconds  # the subflow's time running, as Prefect recorded it
        rate = items / embedding
        base = base or rate
        print(f"workers={n_workers}: {items} items, embedding phase {embedding:.1f} s "
              f"= {rate:.0f} items/s (x{rate / base:.2f} vs 1 worker); whole audit {wall:.1f} s")
    if args.device == "cuda":
        import torch
        from embed_throughput import cuda_matmul_rate  # this folder is on sys.path when run as a script

        print(f"GPU bf16 dense matmul rate: {cuda_matmul_rate(torch.bfloat16) / 1e12:.0f} TFLOP/s "
              "(compare with the model FLOP/s from benchmarks/embed_throughput.py --device cuda)")


if __name__ == "__main__":
    main()
