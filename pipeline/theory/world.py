"""A synthetic concept world: a concept tree, Zipf-sampled items, noisy positive views, ambiguous items.

Every concept node below the root (depth 1 .. ``depth``) owns ``items_per_concept`` items; leaves are the
most specific concepts. A *view* of a concept is an item drawn uniformly from the concept's subtree, so a
broad concept's views are spread over all its descendants while a leaf's views are its own few items.
An item's positive is a view of its concept (with probability ``view_noise`` a uniformly random item
instead). A share of items is *ambiguous*: with probability ``w`` their view comes from a second concept
at the same depth in another top-level branch (a stand-in for human disagreement about what they mean).
Anchors are sampled with Zipf frequencies over a random order of the items, so frequency is independent
of depth and ambiguity by construction and the audit can separate the three.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["World", "WorldConfig", "build_world"]


class WorldConfig(BaseModel):
    """Shape of the concept world (validated; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    depth: int = Field(3, ge=1, le=6, description="levels of concepts below the root; leaves are deepest")
    branching: int = Field(4, ge=2, le=8, description="children per concept")
    items_per_concept: int = Field(3, ge=1, le=20)
    zipf_exponent: float = Field(1.0, ge=0.0, le=3.0, description="anchor frequency ~ 1 / rank^s")
    ambiguous_share: float = Field(0.25, ge=0.0, le=0.9, description="share of items with a second concept")
    view_noise: float = Field(0.05, ge=0.0, lt=1.0, description="chance a positive is a random item")
    seed: int = 0


@dataclass(frozen=True)
class World:
    """A built world: per-item properties plus what the sampler needs (flat arrays, cheap to copy)."""

    config: WorldConfig
    concept: np.ndarray  # int [N]: primary concept of each item
    second: np.ndarray  # int [N]: second concept (= concept for unambiguous items)
    mix: np.ndarray  # float [N]: chance a view comes from the second concept (0 if unambiguous)
    depth: np.ndarray  # int [N]: depth of the primary concept (1 = broadest)
    prob: np.ndarray  # float [N]: anchor sampling probability (Zipf)
    ambiguity: np.ndarray  # float [N]: binary entropy of ``mix`` in bits (0 .. 1)
    subtree_offsets: np.ndarray  # int [C+1]: CSR offsets into ``subtree_items`` per concept
    subtree_items: np.ndarray  # int: items whose primary concept lies in each concept's subtree
    cdf: np.ndarray  # float [N]: cumulative ``prob``

    @property
    def n_items(self) -> int:
        return len(self.concept)

    @property
    def tokens(self) -> list[str]:
        """One text token per item: what the exported model's tokenizer maps to the item's table row."""
        return [f"w{i:05d}" for i in range(self.n_items)]

    def sample_anchors(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """``batch`` anchor items drawn with the Zipf probabilities (with replacement)."""
        # inverse-CDF sampling: the same distribution as rng.choice(p=...), without its per-call setup
        return np.minimum(np.searchsorted(self.cdf, rng.random(batch), side="right"), self.n_items - 1)

    def sample_positives(self, rng: np.random.Generator, anchors: np.ndarray) -> np.ndarray:
        """One positive view per anchor: an item of the anchor's concept subtree, never the anchor itself."""
        use_second = rng.random(len(anchors)) < self.mix[anchors]
        concepts = np.where(use_second, self.second[anchors], self.concept[anchors])
        start = self.subtree_offsets[concepts]
        count = self.subtree_offsets[concepts + 1] - start
        out = self.subtree_items[start + (rng.random(len(anchors)) * count).astype(np.int64)]
        # Redraw views that hit the anchor (a pair of identical inputs carries no alignment signal);
        # a single-item concept keeps its self-pair rather than loop forever.
        for _ in range(8):
            same = (out == anchors) & (count > 1)
            if not same.any():
                break
            pick = (rng.random(same.sum()) * count[same]).astype(np.int64)
            out[same] = self.subtree_items[start[same] + pick]
        noisy = rng.random(len(anchors)) < self.config.view_noise
        out[noisy] = rng.integers(0, self.n_items, size=int(noisy.sum()))
        return out

    def probe_frame(self) -> pl.DataFrame:
        """The world's probe set: item_id, text and the numeric properties the audit correlates with norm.

        ``zipf`` (= log10 p + 9, the Zipf scale of word-frequency lists) repeats ``log_frequency`` on
        another scale so the audit's partial Spearman controlling for frequency applies to this set too.
        """
        return pl.DataFrame({
            "item_id": self.tokens,
            "text": self.tokens,
            "kind": "word",
            "depth": self.depth.astype(float),
            "log_frequency": np.log(self.prob),
            "zipf": np.log10(self.prob) + 9.0,
            "ambiguity": self.ambiguity,
        })


def _tree(depth: int, branching: int) -> tuple[np.ndarray, np.ndarray]:
    """Parent and depth of every concept (breadth-first ids; the root, id -1, is not a concept)."""
    parents, depths, level = [], [], [-1]
    for d in range(1, depth + 1):
        nxt = []
        for p in level:
            for _ in range(branching):
                nxt.append(len(parents))
                parents.append(p)
                depths.append(d)
        level = nxt
    return np.array(parents), np.array(depths)


def _top(parents: np.ndarray) -> np.ndarray:
    """The depth-1 ancestor of every concept."""
    top = np.arange(len(parents))
    while True:
        up = parents[top]
        if (up < 0).all():
            return top
        top = np.where(up >= 0, up, top)


def build_world(config: WorldConfig) -> World:
    """Build the tree, its items, their Zipf frequencies and the ambiguous items, from ``config.seed``."""
    rng = np.random.default_rng(config.seed)
    parents, cdepth = _tree(config.depth, config.branching)
    n_concepts = len(parents)
    concept = np.repeat(np.arange(n_concepts), config.items_per_concept)
    n = len(concept)
    top = _top(parents)
    # subtree membership: walk every item's concept up to the root
    members: list[list[int]] = [[] for _ in range(n_concepts)]
    for item, c in enumerate(concept):
        while c >= 0:
            members[c].append(item)
            c = parents[c]
    offsets = np.concatenate([[0], np.cumsum([len(m) for m in members])])
    flat = np.concatenate([np.array(m, dtype=np.int64) for m in members])
    second = concept.copy()
    mix = np.zeros(n)
    n_amb = int(round(config.ambiguous_share * n))
    for item in rng.choice(n, size=n_amb, replace=False):
        c = concept[item]
        # same depth (ambiguity does not shift depth), another top-level branch (the two meanings differ)
        cands = np.flatnonzero((cdepth == cdepth[c]) & (top != top[c]))
        if len(cands) == 0:
            continue
        second[item] = rng.choice(cands)
        mix[item] = rng.uniform(0.2, 0.5)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -(mix * np.log2(mix) + (1 - mix) * np.log2(1 - mix))
    ambiguity = np.where(mix > 0, ent, 0.0)
    ranks = rng.permutation(n)
    weights = (ranks + 1.0) ** (-config.zipf_exponent)
    prob = weights / weights.sum()
    return World(
        config=config, concept=concept, second=second, mix=mix, depth=cdepth[concept], prob=prob,
        ambiguity=ambiguity, subtree_offsets=offsets, subtree_items=flat, cdf=np.cumsum(prob),
    )
