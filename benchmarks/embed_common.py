"""What the embedding benchmarks share: their texts, the machine's dense matmul rates, model FLOPs, load.

Text sources (each reproducible, offline):

- ``words``: the first N alphabetic words of wordfreq's English top list (or of a word-list file).
- ``cranfield``: Cranfield documents from ``../shared/data/cranfield/corpus.jsonl`` (1,400), in file order: the
  document's text, which in this copy begins with its title (the title is put in front only where it does not).
  Past 1,400, the first half (by sentences, `` . `` separated, at least one) of documents 1, 2, ... follows, so
  2,000 passages = all 1,400 documents + the first halves of the first 600: a mix of lengths, nothing repeated.
- ``chaosnli``: the distinct premises of ChaosNLI's SNLI then MNLI-matched items
  (``../shared/data/chaosnli/chaosNLI_snli.jsonl``, ``chaosNLI_mnli_m.jsonl``), in file order; read in place.

Model FLOPs (forward pass only)::

    dense     = 2 * M * sum_i L_i          M = multiply-accumulates per token of the encoder's
                                             Linear layers (non-embedding weights: QKV, output,
                                             FFN); embeddings, LayerNorm, biases, GELU and the
                                             pooler (once per sequence) are left out
    attention = 4 * n_layers * h * sum_i L_i^2     (Q K^T and softmax(.) V, h = hidden size)

``L_i`` is text i's real (unpadded) token count: useful work.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SOURCES = ("words", "cranfield", "chaosnli")


def _cpu_ticks() -> tuple[int, int, int]:
    """(total, idle, this process's) CPU time in clock ticks, from /proc."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    t = os.times()
    return sum(fields), fields[3] + fields[4], round((t.user + t.system) * os.sysconf("SC_CLK_TCK"))


class OtherLoad:
    """Share of all CPU time used by *other* processes between ``start()`` and ``stop()``."""

    def start(self) -> None:
        try:
            self._a = _cpu_ticks()
        except (OSError, ValueError):
            self._a = None

    def stop(self) -> float:
        if self._a is None:
            return 0.0
        b = _cpu_ticks()
        total, idle, own = (y - x for x, y in zip(self._a, b, strict=True))
        return max(0.0, (total - idle - own) / max(total, 1))


def timed(fn) -> tuple[float, float]:
    """(seconds, share of the CPUs other processes used meanwhile)."""
    load = OtherLoad()
    load.start()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, load.stop()


def words(n: int, path: str | None = None) -> list[str]:
    """The first ``n`` alphabetic words of ``path`` (one or more per line), else of wordfreq's English list."""
    if path:
        out = [w for w in Path(path).read_text().split() if w.isalpha()]
        source = path
    else:
        from wordfreq import top_n_list

        out = [w for w in top_n_list("en", max(30000, 2 * n)) if w.isalpha()]
        source = "wordfreq"
    if len(out) < n:
        raise SystemExit(f"{source} gave only {len(out)} alphabetic words; use --n {len(out)} or less")
    return out[:n]


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path} is missing: the passages come from ../shared/data (or pass --shared-data DIR)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def cranfield_passages(n: int, data: Path = SHARED_DATA) -> list[str]:
    """``n`` Cranfield passages: every document, then first halves of documents in order (module docstring)."""
    docs = []
    for d in _jsonl(data / "cranfield" / "corpus.jsonl"):
        title, text = d.get("title", "").strip(), d.get("text", "").strip()
        docs.append(text if not title or text.startswith(title) else f"{title} {text}")
    out = docs[:n]
    for doc in docs:
        if len(out) >= n:
            break
        sentences = doc.split(" . ")
        out.append(" . ".join(sentences[: max(1, len(sentences) // 2)]))
    if len(out) < n:
        raise SystemExit(f"Cranfield gives at most {len(out)} passages this way; use --n-passages {len(out)} or less")
    return out


def chaosnli_premises(n: int, data: Path = SHARED_DATA) -> list[str]:
    """The first ``n`` distinct premises of ChaosNLI's SNLI, then MNLI-matched items."""
    seen: dict[str, None] = {}
    for name in ("chaosNLI_snli.jsonl", "chaosNLI_mnli_m.jsonl"):
        for item in _jsonl(data / "chaosnli" / name):
            seen.setdefault(item["example"]["premise"].strip(), None)
    out = list(seen)
    if len(out) < n:
        raise SystemExit(f"ChaosNLI has {len(out)} distinct premises; use --n-passages {len(out)} or less")
    return out[:n]


def load_texts(source: str, n_words: int, n_passages: int, words_file: str | None, data: Path) -> list[str]:
    if source == "words":
        return words(n_words, words_file)
    if source == "cranfield":
        return cranfield_passages(n_passages, data)
    return chaosnli_premises(n_passages, data)


def matmul_rate(dtype=None, size: int = 2048, reps: int = 10) -> float:
    """Best dense matmul FLOP/s on the CPU in ``dtype`` (default float32) over a few rounds of ``reps`` products."""
    import torch

    dtype = dtype or torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    out = torch.empty(size, size, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        best = max(best, 2 * size**3 * reps / (time.perf_counter() - t))
    return best


def cuda_matmul_rate(dtype, size: int = 8192, reps: int = 10) -> float:
    """Best dense matmul FLOP/s on the current CUDA device in ``dtype``, timed with CUDA events.

    float32 runs at torch's current matmul precision (TF32 off by default: true float32).
    """
    import torch

    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    out = torch.empty(size, size, device="cuda", dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        end.record()
        end.synchronize()
        best = max(best, 2 * size**3 * reps / (start.elapsed_time(end) / 1e3))
    del a, b, out
    torch.cuda.empty_cache()
    return best


def tf32_matmuls() -> str:
    """Whether float32 matmuls on CUDA may use TF32 (torch's flag), as text."""
    import torch

    try:
        return "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
    except RuntimeError as exc:  # torch refuses to read the flag when old and new APIs were mixed
        return f"unknown ({exc})"


def model_flops(model, lengths) -> float:
    """Forward FLOPs for sequences of the given lengths (formula in the module docstring)."""
    import numpy as np
    import torch

    macs = sum(
        m.in_features * m.out_features
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not name.startswith("pooler")
    )
    cfg = model.config
    lengths = np.asarray(lengths, dtype=np.float64)
    return 2.0 * macs * lengths.sum() + 4.0 * cfg.num_hidden_layers * cfg.hidden_size * (lengths**2).sum()
