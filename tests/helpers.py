"""Helpers that write real stored data through the project's own storage code (no mocks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

from pipeline.probes import ProbeSet, write_probe_tables
from pipeline.storage.parts import commit_part, embeddings_table
from pipeline.storage.shards import split_shards
from pipeline.storage.store import Manifest, Store


@dataclass
class FakeResult:
    vectors: np.ndarray
    norms: np.ndarray
    n_tokens: np.ndarray
    truncated: np.ndarray


def store_synthetic(store: Store, model: str, release: str, ps: ProbeSet, norms: np.ndarray, dim: int = 4,
                    shard_size: int = 50, seed: int = 0, n_tokens: np.ndarray | None = None,
                    vectors: np.ndarray | None = None) -> None:
    """Commit embeddings with the given norms for ``ps`` via write_part/commit_parts (:func:`commit_part`).

    ``vectors`` (rows scaled to ``norms``) default to random directions; ``n_tokens`` defaults to 3.
    """
    write_probe_tables(store, ps)
    rng = np.random.default_rng(seed)
    if vectors is None:
        directions = rng.normal(size=(len(norms), dim))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        vectors = (directions * norms[:, None]).astype(np.float32)
    dim = vectors.shape[1]
    n_tokens = np.full(len(norms), 3) if n_tokens is None else np.asarray(n_tokens)
    fp = "f" * 64
    template = Manifest(model, release, ps.name, fp, {"pooling": "mean"}, dim, "float32")
    for shard in split_shards(ps.name, ps.items, fp, template.params, shard_size):
        sl = slice(shard.start, shard.start + shard.size)
        res = FakeResult(vectors[sl], norms[sl], n_tokens[sl], np.zeros(shard.size, bool))
        commit_part(store, shard, embeddings_table(model, release, shard, res), template)


def word_probe_set(name: str, n: int, props: dict[str, np.ndarray]) -> ProbeSet:
    ids = [f"w{i:05d}" for i in range(n)]
    items = pl.DataFrame({"item_id": ids, "text": [f"word {i}" for i in range(n)], "kind": "word",
                          "lang": "en", "source": "synthetic"})
    long = pl.concat([pl.DataFrame({"item_id": ids, "property": k, "value": v.astype(float)})
                      for k, v in props.items()])
    return ProbeSet(name=name, items=items, properties=long)


def partial_spearman(x, y, z) -> float:
    """Reference partial Spearman: Pearson r of the residuals of rank(x), rank(y) regressed on rank(z)."""
    from scipy import stats

    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])
    ex = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    ey = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    return stats.pearsonr(ex, ey).statistic


M32 = np.uint64(2**32)


def _mix32(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) % M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) % M32
    x ^= x >> np.uint64(16)
    return x


def poisson_weights(seed: int, resamples: int, n: int) -> np.ndarray:
    """(resamples, n) bootstrap weights as pipeline/analysis/bootstrap.py's docstring defines them, written
    independently of it (one replicate at a time, so a benchmark's thousands of items stay small)."""
    keys = _mix32((np.uint64(seed) * np.uint64(2654435769) + np.arange(resamples, dtype=np.uint64)) % M32)
    thresholds = np.floor(stats.poisson.cdf(np.arange(10), 1.0) * 2.0**32).astype(np.uint64)
    out = np.empty((resamples, n), dtype=np.int64)
    for b in range(resamples):
        h = _mix32(keys[b] ^ np.arange(n, dtype=np.uint64))
        out[b] = (h[:, None] >= thresholds[None, :]).sum(axis=1)
    return out


def synthetic_trace(items: int, steps: int, lr: float, seed: int = 3) -> pl.DataFrame:
    """A ``training_trace`` of one run whose norms move by known radial and tangential steps (step 0: no move)."""
    rng = np.random.default_rng(seed)
    rows, norm = [], rng.uniform(1, 3, items)
    for step in range(steps):
        radial = np.zeros(items) if step == 0 else rng.normal(0, 0.05, items)
        tangential = np.zeros(items) if step == 0 else rng.uniform(0.01, 0.2, items)
        new = np.sqrt((norm + radial) ** 2 + tangential**2) if step else norm
        rows.append(pl.DataFrame({"run": "r", "step": step, "item_id": [f"i{i:02d}" for i in range(items)],
                                  "kind": "noun", "norm": new, "r2_change": new**2 - norm**2, "radial": radial,
                                  "tangential": tangential, "lr": 0.0 if step == 0 else lr,
                                  "steps_since": 0 if step == 0 else 1}))
        norm = new
    return pl.concat(rows)
