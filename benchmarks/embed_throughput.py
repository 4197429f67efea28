"""Throughput of ``Embedder.embed`` against ``SentenceTransformer.encode``, and achieved FLOP/s share.

Run:  python benchmarks/embed_throughput.py [--n 20000] [--threads T] [--batch-tokens N] [--repeat 3]

Both paths run in this process with the same torch threads, after a warm-up each, on the same
words (wordfreq's English top list, alphabetic only). Both include tokenization in their time.

Model FLOPs of our run (documented formula, forward pass only)::

    dense     = 2 * M * sum_i L_i          M = multiply-accumulates per token of the encoder's
                                             Linear layers (non-embedding weights: QKV, output,
                                             FFN); embeddings, LayerNorm, biases, GELU and the
                                             pooler (once per sequence) are left out
    attention = 4 * n_layers * h * sum_i L_i^2     (Q K^T and softmax(.) V, h = hidden size)
    total     = dense + attention

``L_i`` is the real (unpadded) token count of text i: that is useful work. The same formula
with each text's padded batch width is printed as "padded FLOPs" (work the hardware did).
The share is useful FLOP/s over the machine's dense float32 matmul rate, measured here with
torch (square matmuls, same threads, best of several).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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


def words(n: int) -> list[str]:
    from wordfreq import top_n_list

    out = [w for w in top_n_list("en", max(30000, 2 * n)) if w.isalpha()]
    if len(out) < n:
        raise SystemExit(f"wordfreq gave only {len(out)} alphabetic words; use --n {len(out)} or less")
    return out[:n]


def matmul_rate(size: int = 2048, reps: int = 10) -> float:
    """Best dense float32 matmul FLOP/s over a few rounds of ``reps`` square products."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        best = max(best, 2 * size**3 * reps / (time.perf_counter() - t))
    return best


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


def timed(fn) -> tuple[float, float]:
    """(seconds, share of the CPUs other processes used meanwhile)."""
    load = OtherLoad()
    load.start()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, load.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="number of words (default 20000)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for both paths")
    ap.add_argument(
        "--batch-tokens", type=int, default=None, help="padded tokens per batch (ours; default: Embedder's)"
    )
    ap.add_argument("--max-batch-size", type=int, default=1024, help="texts per batch at most (ours)")
    ap.add_argument("--st-batch-size", type=int, default=32, help="SentenceTransformer.encode batch_size")
    ap.add_argument(
        "--repeat", type=int, default=3, help="interleaved timed rounds; the best of each path counts"
    )
    ap.add_argument("--model", default="minilm-l6")
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from pipeline.embed import Embedder
    from pipeline.models import get_spec, resolve_model

    torch.set_num_threads(args.threads)
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {args.threads}"
    )
    resolved = resolve_model(get_spec(args.model))
    emb = Embedder(
        resolved,
        device="cpu",
        threads=args.threads,
        batch_tokens=args.batch_tokens,
        max_batch_size=args.max_batch_size,
    )
    st = SentenceTransformer(resolved.path, device="cpu", local_files_only=True)
    texts = words(args.n)
    print(
        f"model: {resolved.spec.name} (dim {resolved.dim}, max_length {resolved.max_length}), "
        f"{len(texts)} words, batch_tokens {emb.batch_tokens}, max_batch_size {args.max_batch_size}, "
        f"ST batch_size {args.st_batch_size}"
    )

    warm = texts[:2000]
    emb.embed(warm)
    st.encode(warm, batch_size=args.st_batch_size)

    # Interleaved rounds, best of each: both paths see the same background load, and a round
    # disturbed by other processes (printed) does not count against either.
    ours_s = st_s = float("inf")
    peak, result = 0.0, []
    for r in range(args.repeat):
        peak = max(peak, matmul_rate())
        o, o_busy = timed(lambda: result.append(emb.embed(texts)))
        stats = emb.last_stats
        s, s_busy = timed(lambda: st.encode(texts, batch_size=args.st_batch_size))
        ours_s, st_s = min(ours_s, o), min(st_s, s)
        print(
            f"  round {r + 1}: ours {o:.2f} s (other load {o_busy:.0%}), "
            f"ST {s:.2f} s (other load {s_busy:.0%})"
        )
    ours_rate, st_rate = len(texts) / ours_s, len(texts) / st_s
    print(f"ours:                  {ours_rate:10.0f} items/s  ({ours_s:.2f} s, {stats.batches} batches)")
    print(f"SentenceTransformer:   {st_rate:10.0f} items/s  ({st_s:.2f} s)")
    print(f"ratio ours / ST:       {ours_rate / st_rate:10.2f}x")

    real = result[-1].n_tokens
    sizes, widths = np.array(stats.batch_shapes).T
    padded = np.repeat(widths, sizes)  # each text's batch width
    useful = model_flops(emb.model, real)
    done = model_flops(emb.model, padded)
    print(
        f"tokens: {real.sum()} real, {stats.padded_tokens} padded "
        f"({stats.padded_tokens / max(real.sum(), 1) - 1:.1%} padding)"
    )
    print(f"model FLOPs: {useful / 1e9:.1f} GFLOP useful, {done / 1e9:.1f} GFLOP padded")
    print(f"dense fp32 matmul rate (2048^3, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s")
    print(
        f"achieved: {useful / ours_s / 1e9:.1f} GFLOP/s useful = {useful / ours_s / peak:.2f} of matmul rate "
        f"({done / ours_s / peak:.2f} counting padded work)"
    )


if __name__ == "__main__":
    main()
