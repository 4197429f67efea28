"""Batched inference that keeps what normalization throws away: raw pooled vectors and their L2 norms.

For sentence-transformers directories the raw vector is the output of the module chain up to (not
including) the first ``Normalize``; for plain transformers directories it is the spec's pooling of
the last hidden state. The hot path tokenizes the whole input once, sorts by token length and packs
batches under a padded-token budget, so short texts run in large batches and little is spent on pads.

torch, transformers and sentence-transformers are imported inside functions: importing this module
is cheap, and the CLI and SQL paths never pay for them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.models import ResolvedModel, transformer_dir

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


CPU_BATCH_TOKENS = 4096
GPU_BATCH_TOKENS = 16384
_MALLOC_TUNED = False


def _keep_freed_memory() -> None:
    """Stop glibc from handing activation buffers back to the OS after every batch (CPU only).

    By default glibc serves large blocks with mmap and trims the heap eagerly, so every batch
    re-faults its activations page by page (about 50k minor faults per MiniLM batch of 4k tokens,
    ~10% of the forward time). Raising the mmap threshold to its 32 MiB maximum and the trim
    threshold to 1 GiB keeps freed blocks mapped for the next batch. Process-wide, applied once;
    a no-op where the C library has no ``mallopt``.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


def pick_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` if available, else ``mps``, else ``cpu``; explicit names are checked."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} requested but torch sees no CUDA GPU; use device='cpu' or 'auto'"
        )
    return device


# Pooling config keys of sentence-transformers and the pooling this module computes for them itself.
_ST_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}


def native_st_pooling(path) -> str | None:
    """The pooling of a sentence-transformers model whose modules this module runs without the library.

    That is the common stack, Transformer -> Pooling (CLS or mean, one mode) -> optional Normalize,
    with a cased tokenizer (``do_lower_case`` false): the transformer's last hidden state pooled
    exactly as sentence-transformers pools it (the tests compare with ``SentenceTransformer.encode``).
    Importing sentence-transformers costs seconds per worker process; any other stack (Dense layers,
    several or other pooling modes, prompts kept out of the pooling) returns None and is run by
    sentence-transformers itself.
    """
    import json
    from pathlib import Path

    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text())
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        bert_config = root / modules[0].get("path", "") / "sentence_bert_config.json"
        if bert_config.is_file() and json.loads(bert_config.read_text()).get("do_lower_case"):
            return None
        config = json.loads((root / modules[1].get("path", "") / "config.json").read_text())
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    on = {k for k, v in config.items() if k.startswith("pooling_mode_") and v}
    if config.get("pooling_mode") is not None or config.get("include_prompt") is False or len(on) != 1:
        return None
    return _ST_POOLING_MODES.get(on.pop())


class Embedder:
    """A model loaded once, embedding lists of texts into :class:`EmbedResult`.

    ``batch_tokens`` bounds the padded tokens of one forward batch (``None``: 4096 on CPU, where larger
    batches spill activations out of cache and past glibc's 32 MiB mmap threshold and run ~15% slower
    on MiniLM; 16384 on GPUs) and ``max_batch_size`` the texts in it; ``threads`` sets torch's
    intra-op threads for this process. On CPU, ``keep_memory``
    tunes the process's malloc so batches reuse their buffers (see :func:`_keep_freed_memory`).
    """

    def __init__(
        self,
        resolved: ResolvedModel,
        device: str = "auto",
        threads: int | None = None,
        batch_tokens: int | None = None,
        max_batch_size: int = 1024,
        keep_memory: bool = True,
    ) -> None:
        import torch

        if (batch_tokens is not None and batch_tokens < 1) or max_batch_size < 1:
            raise ValueError(
                f"batch_tokens and max_batch_size must be positive, not {batch_tokens}, {max_batch_size}"
            )
        if threads:
            torch.set_num_threads(threads)
        self.resolved = resolved
        self.device = pick_device(device)
        if keep_memory and self.device == "cpu":
            _keep_freed_memory()
        if batch_tokens is None:
            batch_tokens = CPU_BATCH_TOKENS if self.device == "cpu" else GPU_BATCH_TOKENS
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size
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
        self._pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        self._input_names = set(self._tokenizer.model_input_names)
        self._backend = self._make_backend()

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

    def _make_backend(self):
        """A private copy of the fast tokenizer's Rust backend: truncation on, padding off.

        A copy, because tokenizer.json files often carry their own fixed padding/truncation (MiniLM's
        pads to 128) and the shared HF tokenizer object must not be reconfigured under its users.
        """
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_padding()
        copy.enable_truncation(max_length=self.max_length, strategy="longest_first", stride=0)
        return copy

    @property
    def model(self):
        """The underlying transformers model (e.g. to count parameters)."""
        return self._model

    @property
    def dim(self) -> int:
        """Length of the raw vectors this embedder returns."""
        return self.resolved.dim

    # -- tokenization ----------------------------------------------------------------------------

    def _tokenize(self, texts: list[str]) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
        """Token ids and type ids (truncated, with special tokens) and a truncation flag per text."""
        if self._backend is not None:
            encs = self._backend.encode_batch(texts, add_special_tokens=True)
            # Overflow pieces exist exactly when the text had more than max_length tokens.
            truncated = np.fromiter((bool(e.overflowing) for e in encs), dtype=bool, count=len(encs))
            return [e.ids for e in encs], [e.type_ids for e in encs], truncated
        full = self._tokenizer(texts, truncation=False, add_special_tokens=True)["input_ids"]
        enc = self._tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)
        types = enc.get("token_type_ids") or [[0] * len(ids) for ids in enc["input_ids"]]
        return enc["input_ids"], types, np.array([len(f) > self.max_length for f in full], dtype=bool)

    def _plan(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Batches of text indices: longest first, each under the padded-token budget."""
        order = np.argsort(-lengths, kind="stable")
        batches, start, n = [], 0, len(order)
        while start < n:
            longest = max(int(lengths[order[start]]), 1)
            size = max(1, min(self.max_batch_size, self.batch_tokens // longest, n - start))
            batches.append(order[start : start + size])
            start += size
        return batches

    # -- inference -------------------------------------------------------------------------------

    def _forward(self, input_ids, attention_mask, token_type_ids):
        import torch

        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        if self._st_modules is not None:
            for module in self._st_modules:
                features = module(features)
            return features["sentence_embedding"]
        hidden = self._model(**features).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "last":
            last = attention_mask.sum(dim=1) - 1  # right padding: last real token
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    def embed(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> EmbedResult:
        """Raw vectors (float32), norms (float64), token counts and truncation flags, in input order.

        ``progress``, if given, is called with the number of texts finished after each batch.
        """
        import torch

        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"text {i} is {type(t).__name__}, not str: pass strings only (no None/NaN)")
        n, dim = len(texts), self.resolved.dim
        vectors = np.empty((n, dim), dtype=np.float32)
        norms = np.empty(n, dtype=np.float64)
        stats = _Stats(texts=n)
        if n == 0:
            self.last_stats = stats
            return EmbedResult(vectors, norms, np.empty(0, np.int32), np.empty(0, bool))
        ids, type_ids, truncated = self._tokenize(texts)
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int32, count=n)
        with_types = "token_type_ids" in self._input_names
        # MPS has no float64; elsewhere the norm is taken in float64 straight from the model output.
        norm_dtype = torch.float32 if self.device.startswith("mps") else torch.float64
        done = 0
        with self._lock, torch.inference_mode():
            for batch in self._plan(lengths):
                width = max(int(lengths[batch].max()), 1)
                arr_ids = np.full((len(batch), width), self._pad_id, dtype=np.int64)
                arr_types = np.zeros((len(batch), width), dtype=np.int64) if with_types else None
                for row, i in enumerate(batch):
                    arr_ids[row, : lengths[i]] = ids[i]
                    if with_types:
                        arr_types[row, : lengths[i]] = type_ids[i]
                mask = (np.arange(width)[None, :] < lengths[batch][:, None]).astype(np.int64)
                to = self.device
                raw = self._forward(
                    torch.from_numpy(arr_ids).to(to),
                    torch.from_numpy(mask).to(to),
                    torch.from_numpy(arr_types).to(to) if with_types else None,
                )
                if raw.shape[-1] != dim:
                    raise RuntimeError(f"model produced {raw.shape[-1]}-d vectors but {dim} were expected")
                batch_norms = torch.linalg.vector_norm(raw, dim=1, dtype=norm_dtype)
                vectors[batch] = raw.float().cpu().numpy()
                norms[batch] = batch_norms.cpu().numpy()
                stats.batches += 1
                stats.real_tokens += int(lengths[batch].sum())
                stats.padded_tokens += len(batch) * width
                stats.batch_shapes.append((len(batch), width))
                done += len(batch)
                if progress is not None:
                    progress(done)
        self.last_stats = stats
        return EmbedResult(vectors, norms, lengths, truncated)

    def token_norms(self) -> TokenNorms:
        """L2 norms of the rows of ``model.get_input_embeddings().weight``, computed in float64."""
        import torch

        with torch.inference_mode():
            weight = self._model.get_input_embeddings().weight.detach().to("cpu", torch.float64).numpy()
        norms = np.linalg.norm(weight, axis=1)
        ids = np.arange(weight.shape[0], dtype=np.int64)
        if self._backend is not None:
            tokens = [self._backend.id_to_token(int(i)) or "" for i in ids]
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
