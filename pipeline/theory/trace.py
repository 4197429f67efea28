"""The training trace: every traced step, each probe item's norm and how its embedding moved.

A fixed sample of probe items (WordNet nouns and the test split's definitions) is embedded after every
``trace_every`` optimizer steps with the model being trained: raw pooled vectors, before any ``Normalize``
module, exactly what an audit of the saved checkpoint stores. Per item and traced step the
``training_trace`` table keeps the norm and the displacement since the previous trace split into its
radial part (along the previous embedding) and the length of its tangential part, and the learning rate
of the step. With ``r`` the previous norm, the change of ``r^2`` is exactly
``2 r radial + radial^2 + tangential^2``: the suite checks that every row adds up.

Why every step by default: docs/theory.md section 6. Heat is the squared tangential displacement per step; over
``s`` steps the noise adds up as ``s`` and the drift as ``s^2``, so a trace every ``s`` steps does not give
the per-step heat and the estimate collapses for a shared encoder.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline.probes.splits import reverse_dictionary_pairs
from pipeline.probes.wordnet import load_wordnet_nouns

TRACE_KINDS = ("noun", "definition")
TRACE_SCHEMA = pa.schema([
    ("run", pa.string()), ("step", pa.int64()), ("item_id", pa.string()), ("kind", pa.string()),
    ("norm", pa.float64()), ("r2_change", pa.float64()), ("radial", pa.float64()),
    ("tangential", pa.float64()), ("lr", pa.float64()), ("steps_since", pa.int64()),
])


def trace_sample(n_nouns: int, n_definitions: int, seed: int = 0) -> pl.DataFrame:
    """``(item_id, kind, text)``: ``n_nouns`` WordNet nouns and ``n_definitions`` test-split definitions.

    Item ids are those of the ``wordnet-nouns`` and ``wordnet-reverse-dictionary-test`` probe sets (``q:``
    for a definition), so the trace joins with the audits of the same checkpoints. Drawn with ``seed``,
    then kept in probe-set order.
    """
    rng = np.random.default_rng(seed)
    nouns = load_wordnet_nouns().items
    tests = reverse_dictionary_pairs("test")
    if n_nouns > nouns.height or n_definitions > tests.height:
        raise ValueError(f"the trace sample asks for {n_nouns} nouns and {n_definitions} definitions; there are "
                         f"{nouns.height} and {tests.height}: lower --trace-nouns or --trace-definitions")
    pick_n = np.sort(rng.choice(nouns.height, n_nouns, replace=False))
    pick_d = np.sort(rng.choice(tests.height, n_definitions, replace=False))
    return pl.concat([
        nouns[pick_n].select("item_id", pl.lit("noun").alias("kind"), "text"),
        tests[pick_d].select(("q:" + pl.col("lemma")).alias("item_id"), pl.lit("definition").alias("kind"),
                             pl.col("definition").alias("text")),
    ])


def pre_normalize_modules(model) -> list:
    """The modules of a sentence-transformers model up to (not including) ``Normalize``: what the audit stores."""
    modules = []
    for module in model:
        if type(module).__name__ == "Normalize":  # the audit stores the vector before it, so does the trace
            break
        modules.append(module)
    return modules


class TraceEncoder:
    """The traced texts, tokenized once into batches of similar length, and their raw pooled vectors.

    Why: the trace runs after every optimizer step, so its cost is paid ``steps`` times. The texts never
    change during a run, so they are tokenized once (:meth:`sentence_transformers.SentenceTransformer.preprocess`,
    as ``encode`` does), sorted by token count and cut into batches of at most ``max_batch`` texts and
    ``max_tokens`` padded tokens. For MiniLM and 300 nouns and 150 definitions that is 4,471
    padded tokens a trace for 3,693 real ones, where four batches of 128 in sample order (4-token nouns
    padded to 48-token definitions) ran 11,484. Each step is one no-grad forward per batch in eval mode.
    Padding is masked out of attention and mean pooling, so the vectors equal those of any other batching
    to float32 rounding (the test checks 1e-5 against the old per-128 batching and against the audit's
    embedder on the saved checkpoints).
    """

    def __init__(self, model, texts: list[str], max_tokens: int = 1024, max_batch: int = 32) -> None:
        import torch

        self.model = model
        self.n = len(texts)
        self.modules = pre_normalize_modules(model)
        device = next(model.parameters()).device
        self.batches: list[tuple[np.ndarray, dict]] = []
        if not texts:
            return
        lengths = model.preprocess(texts)["attention_mask"].sum(1).cpu().numpy()
        order = np.argsort(-lengths, kind="stable")  # longest first: each batch pads to its first text
        lo = 0
        while lo < len(order):
            width = int(lengths[order[lo]])
            size = max(1, min(max_batch, max_tokens // max(width, 1), len(order) - lo))
            idx = order[lo:lo + size]
            features = model.preprocess([texts[i] for i in idx])
            features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
            self.batches.append((idx, features))
            lo += size

    @property
    def padded_tokens(self) -> int:
        """Tokens one trace runs through the model, padding included."""
        return int(sum(f["attention_mask"].numel() for _, f in self.batches))

    def vectors(self) -> np.ndarray:
        """Raw pooled vectors (float32, ``[n, dim]``, in text order) of the model as it is now, before ``Normalize``.

        Runs the model in eval mode without gradients and restores its training mode after.
        """
        import torch

        out: np.ndarray | None = None
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for idx, features in self.batches:
                    feats = dict(features)  # modules add their outputs to the dict: keep the tokenized inputs
                    for module in self.modules:
                        feats = module(feats)
                    vec = feats["sentence_embedding"].float().cpu().numpy()
                    if out is None:
                        out = np.empty((self.n, vec.shape[1]), np.float32)
                    out[idx] = vec
        finally:
            self.model.train(was_training)
        return out if out is not None else np.zeros((0, 0), np.float32)


def displacement(before: np.ndarray, after: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, in float64: change of r^2, radial displacement (along ``before``), tangential length."""
    z, za = before.astype(np.float64), after.astype(np.float64)
    r = np.sqrt((z * z).sum(1))
    u = z / r[:, None]
    disp = za - z
    radial = (disp * u).sum(1)
    tangential = np.sqrt(((disp - radial[:, None] * u) ** 2).sum(1))
    return (za * za).sum(1) - r * r, radial, tangential


class TraceRecorder:
    """Keeps the last traced vectors and the rows not yet written; one per training run."""

    def __init__(self, run: str, sample: pl.DataFrame) -> None:
        self.run = run
        self.sample = sample
        self.texts = sample["text"].to_list()
        self._last: np.ndarray | None = None
        self._last_step = 0
        self._rows: list[pa.Table] = []

    def record(self, step: int, vectors: np.ndarray, lr: float) -> None:
        """Add one trace: ``vectors`` of the sample after ``step`` optimizer steps, ``lr`` that step's rate."""
        n = len(self.texts)
        if vectors.shape[0] != n:
            raise ValueError(f"trace at step {step}: {vectors.shape[0]} vectors for {n} sample items")
        if self._last is None:  # the first trace: nothing moved yet
            change = radial = tangential = np.zeros(n)
        else:
            change, radial, tangential = displacement(self._last, vectors)
        norms = np.sqrt((vectors.astype(np.float64) ** 2).sum(1))
        self._rows.append(pa.table({
            "run": [self.run] * n, "step": np.full(n, step, np.int64), "item_id": self.sample["item_id"].to_list(),
            "kind": self.sample["kind"].to_list(), "norm": norms, "r2_change": change, "radial": radial,
            "tangential": tangential, "lr": np.full(n, lr, np.float64),
            "steps_since": np.full(n, step - self._last_step if self._last is not None else 0, np.int64),
        }, schema=TRACE_SCHEMA))
        self._last, self._last_step = vectors, step

    def take(self) -> pa.Table | None:
        """The rows recorded since the last call (None if none), in step order."""
        if not self._rows:
            return None
        table, self._rows = pa.concat_tables(self._rows), []
        return table
