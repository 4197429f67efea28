"""Batched inference that keeps what normalization throws away: raw pooled vectors and their L2 norms.

For sentence-transformers directories the raw vector is the output of the module chain up to (not
including) the first ``Normalize``; for plain transformers directories it is the spec's pooling of
the last hidden state. The hot path tokenizes the input in chunks, sorts each chunk by token length and
packs its batches under a padded-token budget, so short texts run in large batches and little is spent
on pads (:mod:`pipeline.embedding.batching`). On a GPU the next chunk is tokenized on a helper thread while this
one's batches run, and each chunk goes to the device in one copy and comes back in one: the forward
passes are queued without waiting for the GPU in between.

torch, transformers and sentence-transformers are imported inside functions: importing this module
is cheap, and the CLI and SQL paths never pay for them.

``precision`` (:mod:`pipeline.embedding.precision`) runs the transformer in bfloat16 or float16 by casting its
weights (``model.to(dtype)``); the pooling, the raw vector and its norm are computed from the model output cast
to float32 (norm in float64). A cast model rather than ``torch.autocast``: on CPU (MiniLM, 20,000 words,
2-core Xeon with AMX, 3 interleaved rounds on a loaded machine) the cast model was faster in every round
(best 6.4 s vs 11.3 s for autocast) and its norms' largest relative error vs float32 was 6.8e-3 (autocast
4.2e-3, mean 1.3e-3 vs 0.6e-3): exact enough for rank statistics, and autocast also re-casts the weights
on every batch. ``benchmarks/embed_throughput.py --precision`` prints the bf16 figures.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.embedding.batching import Tokens, chunk_bounds, computed_ahead, pack_batches, plan_batches
from pipeline.embedding.devices import (
    HostCopy,
    activation_bytes,
    keep_freed_memory,
    pick_device,
    to_device,
    to_host,
)
from pipeline.embedding.models import ResolvedModel, transformer_dir
from pipeline.embedding.pooling import native_st_pooling
from pipeline.embedding.precision import check_precision, torch_dtype
from pipeline.embedding.tokenize import TextTokenizer

__all__ = ["EmbedResult", "Embedder", "TokenNorms", "get_embedder", "pick_device"]


@dataclass(frozen=True)
class EmbedResult:
    """Per-text output, in input order: raw vectors, their L2 norms, token counts and truncation flags."""

    vectors: np.ndarray  # float32 [n, d], raw (not normalized)
    norms: np.ndarray  # float64 [n], L2 of the raw pooled vector, taken before any downcast
    n_tokens: np.ndarray  # int32 [n], tokens incl. special tokens after truncation
    truncated: np.ndarray  # bool [n], the text had more than max_length tokens

    def __len__(self) -> int:
        return len(self.norms)


@dataclass(frozen=True)
class TokenNorms:
    """L2 norms (float64) of the rows of the input token-embedding table."""

    token_ids: np.ndarray  # int64 [V]
    tokens: list[str]  # "" for ids the tokenizer has no string for (padded vocabularies)
    norms: np.ndarray  # float64 [V]


@dataclass
class _Stats:
    """Counters of the last :meth:`Embedder.embed` call (for benchmarks and progress reports)."""

    texts: int = 0
    batches: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    batch_shapes: list[tuple[int, int]] = field(default_factory=list, repr=False)  # (texts, padded width)
    # seconds the main loop waited for a chunk's tokens (on CPU: all of tokenization; on a GPU the device has
    # nothing new queued meanwhile), and the call's wall time
    tokenize_wait_s: float = 0.0
    wall_s: float = 0.0

    @property
    def waiting_share(self) -> float:
        """Share of the wall time the main loop (and so, past its queue, the device) waited for tokens."""
        return self.tokenize_wait_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class _Queued:
    """One chunk's outputs on their way to host memory, and the result rows they fill."""

    rows: np.ndarray  # int64: result row of each output row
    outputs: HostCopy  # vectors [m, d] float32, norms [m]
    sizes: list[int]  # batches whose progress is reported when collected (empty: reported as they ran)


class _Progress:
    """Counts finished texts and passes the running total to the caller's callback, if any."""

    def __init__(self, callback: Callable[[int], None] | None) -> None:
        self.callback, self.done = callback, 0

    def __call__(self, finished: int) -> None:
        self.done += finished
        if self.callback is not None:
            self.callback(self.done)


CPU_BATCH_TOKENS = 4096
GPU_BATCH_TOKENS = 16384
# Texts per chunk (see pipeline.embedding.batching.chunk_bounds). On a GPU, chunks overlap tokenization with the
# device. On CPU they bound what a shard's tokens hold (the Rust encodings and their id lists): at 16,384 a
# process embedding 131,072-sentence shards peaked ~0.2 GiB lower than at 65,536, in the same time
# (docs/benchmarks.md, issue 36's fifth part); chunks of 4,096 took 15% longer on 20,000 words (each chunk is
# sorted by length on its own, and short chunks leave batches less full).
CPU_CHUNK_TEXTS = 16384
GPU_CHUNK_TEXTS = 32768


class Embedder:
    """A model loaded once, embedding lists of texts into :class:`EmbedResult`.

    ``batch_tokens`` bounds the padded tokens of one forward batch (``None``: 4096 on CPU, where larger
    batches spill activations out of cache and past glibc's 32 MiB mmap threshold and run ~15% slower
    on MiniLM; 16384 on GPUs) and ``max_batch_size`` the texts in it; ``threads`` sets torch's
    intra-op threads for this process. ``chunk_texts`` is the most texts tokenized and planned together
    (``None``: 16,384 on CPU, 32,768 on GPUs; 0: all at once); see :meth:`embed`. ``tokenize_ahead`` (on GPUs
    only) tokenizes the next chunk on a helper thread while this one runs. On CPU, ``keep_memory``
    tunes the process's malloc so batches reuse their buffers, with an mmap threshold just above this model's
    largest activation block (``mmap_threshold``; see :func:`pipeline.embedding.devices.keep_freed_memory`).
    ``precision`` is the dtype the transformer runs in (float32, bfloat16 or float16;
    :func:`pipeline.embedding.precision.check_precision` refuses what the device cannot run); vectors and norms
    are float32 / float64 whatever it is.
    """

    def __init__(
        self,
        resolved: ResolvedModel,
        device: str = "auto",
        threads: int | None = None,
        batch_tokens: int | None = None,
        max_batch_size: int = 1024,
        keep_memory: bool = True,
        chunk_texts: int | None = None,
        precision: str = "float32",
    ) -> None:
        import torch

        if (batch_tokens is not None and batch_tokens < 1) or max_batch_size < 1:
            raise ValueError(
                f"batch_tokens and max_batch_size must be positive, not {batch_tokens}, {max_batch_size}"
            )
        if chunk_texts is not None and chunk_texts < 0:
            raise ValueError(f"chunk_texts must be 0 (one chunk) or positive, not {chunk_texts}")
        if threads:
            torch.set_num_threads(threads)
        self.resolved = resolved
        self.device = pick_device(device)
        check_precision(self.device, precision)
        self.precision = precision
        if batch_tokens is None:
            batch_tokens = CPU_BATCH_TOKENS if self.device == "cpu" else GPU_BATCH_TOKENS
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size
        if chunk_texts is None:
            chunk_texts = CPU_CHUNK_TEXTS if self.device == "cpu" else GPU_CHUNK_TEXTS
        self.chunk_texts = chunk_texts
        self.tokenize_ahead = self.device != "cpu"  # see embed()
        # On a GPU the host queues work ahead and reads results back per chunk; on CPU a batch is done
        # when its forward returns, so progress is reported per batch as it happens.
        self._queue_ahead = self.device != "cpu"
        # MPS has no float64; elsewhere the norm is taken in float64 straight from the model output.
        self._norm_dtype = torch.float32 if self.device.startswith("mps") else torch.float64
        self.max_length = resolved.max_length
        self.last_stats = _Stats()
        self._lock = threading.Lock()
        self._st_modules: list | None = None
        native = native_st_pooling(resolved.path) if resolved.is_sentence_transformers else None
        if resolved.is_sentence_transformers and resolved.spec.pooling == "auto" and native is None:
            self._load_sentence_transformers()
        else:
            self._load_transformers()
            if resolved.spec.pooling == "auto" and native is not None:
                self.pooling = native
        self._model.eval()
        if precision != "float32":  # only the transformer: pooling and any later modules stay float32
            self._model.to(torch_dtype(precision))
        self._pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        self.tokenizer = TextTokenizer(self._tokenizer, self.max_length)
        self._with_types = self.tokenizer.with_types
        # the malloc tuning follows this model's batch (set once it is loaded: its width is in its config)
        self.mmap_threshold = (keep_freed_memory(activation_bytes(self._model.config, self.batch_tokens))
                               if keep_memory and self.device == "cpu" else 0)

    # -- loading ---------------------------------------------------------------------------------

    def _load_sentence_transformers(self) -> None:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(self.resolved.path, device=self.device, local_files_only=True)
        modules = []
        for module in st:
            if type(module).__name__ == "Normalize":
                break
            modules.append(module)
        self._st = st
        self._st_modules = modules
        self._tokenizer = st[0].tokenizer
        self._model = st[0].auto_model
        self.pooling = "st"

    def _load_transformers(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = transformer_dir(self.resolved.path)
        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device)
        self.pooling = "mean" if self.resolved.spec.pooling == "auto" else self.resolved.spec.pooling

    @property
    def model(self):
        """The underlying transformers model (e.g. to count parameters)."""
        return self._model

    @property
    def dim(self) -> int:
        """Length of the raw vectors this embedder returns."""
        return self.resolved.dim

    # -- tokenization ----------------------------------------------------------------------------

    def _tokenize(self, texts: list[str]) -> Tokens:
        """Token ids (truncated, with special tokens), type ids where not all 0, and a truncation flag per text."""
        return self.tokenizer(texts)

    # -- inference -------------------------------------------------------------------------------

    def _forward(self, input_ids, attention_mask, token_type_ids, padded: bool = True):
        import torch

        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        if self._st_modules is not None:
            features = self._st_modules[0](features)
            if self.precision != "float32":  # the modules after the transformer run in float32
                features = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                            for k, v in features.items()}
            for module in self._st_modules[1:]:
                features = module(features)
            return features["sentence_embedding"]
        if not padded:
            # Without pads the model attends to every token with or without a mask, and transformers
            # checks a given mask with `mask.all()`, which waits for the GPU: a sync per batch.
            del features["attention_mask"]
        hidden = self._model(**features).last_hidden_state.float()  # a no-op in float32
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "last":
            last = attention_mask.sum(dim=1) - 1  # right padding: last real token
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> EmbedResult:
        """Raw vectors (float32), norms (float64), token counts and truncation flags, in input order.

        Texts are tokenized, planned and batched in chunks of at most ``chunk_texts`` (results do not
        depend on the chunking beyond float rounding). On a GPU, the next chunk is tokenized on a helper
        thread while this chunk's batches run, and a chunk's outputs stay on the device until all its
        batches are queued. ``progress``, if given, is called with the number of texts finished after each
        batch, in order, ending at ``len(texts)``: on CPU as each batch ends, on a GPU once its chunk's
        outputs are back in host memory.
        """
        import torch

        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"text {i} is {type(t).__name__}, not str: pass strings only (no None/NaN)")
        n, dim = len(texts), self.resolved.dim
        vectors = np.empty((n, dim), dtype=np.float32)
        norms = np.empty(n, dtype=np.float64)
        lengths = np.empty(n, dtype=np.int32)
        truncated = np.empty(n, dtype=bool)
        stats = _Stats(texts=n)
        began = time.perf_counter()
        if n == 0:
            self.last_stats = stats
            return EmbedResult(vectors, norms, lengths, truncated)
        bounds = chunk_bounds(n, self.chunk_texts)
        report = _Progress(progress)
        # On a GPU the next chunk is tokenized while this one runs; on CPU torch's threads already keep the cores
        # busy, and a tokenizing thread beside them slows both, so chunks are tokenized in turn.
        chunks = computed_ahead(self._tokenize, [texts[a:b] for a, b in bounds], ahead=self.tokenize_ahead)
        with self._lock, torch.inference_mode(), contextlib.closing(chunks):
            queued = None
            for start, stop in bounds:
                waited = time.perf_counter()
                tokens = next(chunks)
                stats.tokenize_wait_s += time.perf_counter() - waited
                lengths[start:stop] = tokens.lengths
                truncated[start:stop] = tokens.truncated
                # queue this chunk before waiting for the last one, so the device never runs dry
                ahead = self._queue_chunk(tokens, start, stats, report)
                if queued is not None:
                    self._collect(queued, vectors, norms, report)
                queued = ahead
            self._collect(queued, vectors, norms, report)
        stats.wall_s = time.perf_counter() - began
        self.last_stats = stats
        return EmbedResult(vectors, norms, lengths, truncated)

    def _queue_chunk(self, tokens: Tokens, start: int, stats: _Stats, report: _Progress) -> _Queued:
        """Run (on a GPU: queue) every batch of one chunk; its outputs start back to host memory at the end."""
        import torch

        dim = self.resolved.dim
        packed = pack_batches(
            tokens, plan_batches(tokens.lengths, self.batch_tokens, self.max_batch_size), self._pad_id,
            self._with_types,
        )
        inputs = to_device(packed.arrays, self.device)
        out_vectors = torch.empty((len(packed.rows), dim), dtype=torch.float32, device=self.device)
        out_norms = torch.empty(len(packed.rows), dtype=self._norm_dtype, device=self.device)
        row = col = 0
        for (size, width), real in zip(packed.shapes, packed.real, strict=True):
            batch = inputs[:, col : col + size * width].view(-1, size, width)  # each row contiguous
            raw = self._forward(batch[0], batch[1], batch[2] if self._with_types else None, real < size * width)
            if raw.shape[-1] != dim:
                raise RuntimeError(f"model produced {raw.shape[-1]}-d vectors but {dim} were expected")
            out_vectors[row : row + size] = raw
            out_norms[row : row + size] = torch.linalg.vector_norm(raw, dim=1, dtype=self._norm_dtype)
            stats.batches += 1
            stats.real_tokens += real
            stats.padded_tokens += size * width
            stats.batch_shapes.append((size, width))
            row, col = row + size, col + size * width
            if not self._queue_ahead:
                report(size)
        sizes = [size for size, _ in packed.shapes] if self._queue_ahead else []
        return _Queued(start + packed.rows, to_host(out_vectors, out_norms), sizes)

    @staticmethod
    def _collect(queued: _Queued, vectors: np.ndarray, norms: np.ndarray, report: _Progress) -> None:
        """Wait for one chunk's outputs, put them in their result rows, and report the chunk's progress."""
        vectors[queued.rows], norms[queued.rows] = queued.outputs.numpy()
        for size in queued.sizes:
            report(size)

    def token_norms(self) -> TokenNorms:
        """L2 norms of the rows of ``model.get_input_embeddings().weight``, computed in float64."""
        import torch

        with torch.inference_mode():
            weight = self._model.get_input_embeddings().weight.detach().to("cpu", torch.float64).numpy()
        norms = np.linalg.norm(weight, axis=1)
        ids = np.arange(weight.shape[0], dtype=np.int64)
        backend = self.tokenizer.backend
        if backend is not None:
            tokens = [backend.id_to_token(int(i)) or "" for i in ids]
        else:
            tokens = [t or "" for t in self._tokenizer.convert_ids_to_tokens(ids.tolist())]
        return TokenNorms(token_ids=ids, tokens=tokens, norms=norms)


_EMBEDDERS: dict[tuple, Embedder] = {}
_EMBEDDERS_LOCK = threading.Lock()


def get_embedder(resolved: ResolvedModel, device: str = "auto", threads: int | None = None, **kw) -> Embedder:
    """A per-process cached :class:`Embedder`, so a Dask worker loads each model once across shards."""
    key = (resolved.fingerprint, resolved.path, resolved.spec, device, threads, tuple(sorted(kw.items())))
    with _EMBEDDERS_LOCK:
        embedder = _EMBEDDERS.get(key)
        if embedder is None:
            embedder = _EMBEDDERS[key] = Embedder(resolved, device=device, threads=threads, **kw)
        return embedder
