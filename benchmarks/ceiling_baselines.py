"""The encodes pipeline_ceiling.py times a whole audit against, run as the audit's workers run: W spawned processes
of T torch threads each (T = cores // W, the audit's default), each given slices of the probe file in turn.

- ``embedder``: the audit's own ``Embedder.embed`` (token-budget batches, lengths sorted): the audit does this
  work and more on the same cores, so a whole audit cannot reach it.
- ``sentence-transformers``: ``SentenceTransformer.encode`` with its defaults (batch of 32 texts), the encode a
  user runs by hand, in the same W processes of T threads.

One process of W x T threads would be a different baseline, and a fragile one: on a shared, busy machine its
threads wait on each other (measured here with the tiny model: 2 threads 13 x slower than 1).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLICE = 50_000  # texts per job: small enough to spread evenly over the processes
KINDS = ("embedder", "sentence-transformers")
WARM_UP = ["warm up the model", "and its tokenizer"] * 128

_ENCODE = None  # in each process: the loaded model's encode, set once by _init


def use_code(code: Path | None) -> Path:
    """Import ``pipeline`` and ``tests`` from ``code`` (default: this repository) before anything else does."""
    base = (code or REPO).resolve()
    sys.path.insert(0, str(base))
    import pipeline
    import tests

    for mod in (pipeline, tests):
        if not Path(mod.__file__).resolve().is_relative_to(base):
            sys.exit(f"error: {mod.__name__} was imported from {mod.__file__}, not from {base}")
    return base


def _init(code: str, model: str, threads: int, kind: str) -> None:
    global _ENCODE
    use_code(Path(code))
    if kind == "embedder":
        from pipeline.audit.steps import resolve
        from pipeline.embedding.embed import Embedder

        _ENCODE = Embedder(resolve(model), device="cpu", threads=threads).embed
    else:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        _ENCODE = SentenceTransformer(model, device="cpu", local_files_only=True).encode
    _ENCODE(WARM_UP)


def _slice(probes: str, lo: int, hi: int) -> int:
    import polars as pl

    texts = pl.scan_parquet(probes).select("text").slice(lo, hi - lo).collect()["text"].to_list()
    _ENCODE(texts)
    return len(texts)


class ParallelEncode:
    """One baseline (``kind``, one of :data:`KINDS`) of the model at ``model`` with the code at ``code``."""

    def __init__(self, code: Path, model: str, workers: int, threads: int, kind: str = "embedder"):
        if kind not in KINDS:
            raise ValueError(f"unknown baseline {kind!r}; one of {', '.join(KINDS)}")
        self.code, self.model, self.workers, self.threads, self.kind = code, model, workers, threads, kind

    def seconds(self, probes: str, lo: int, hi: int) -> float:
        """Seconds to encode rows ``lo:hi``; the processes start (and warm up) untimed and end after, so they
        hold no memory while the audit runs."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                 initargs=(str(self.code), self.model, self.threads, self.kind)) as pool:
            list(pool.map(time.sleep, [0.0] * self.workers))  # every process up and warm before the clock starts
            t = time.perf_counter()
            bounds = [(a, min(a + SLICE, hi)) for a in range(lo, hi, SLICE)]
            done = sum(pool.map(_slice, [probes] * len(bounds), *zip(*bounds, strict=True)))
            spent = time.perf_counter() - t
        assert done == hi - lo, f"{self.kind} encoded {done} texts of {hi - lo}"
        return spent
