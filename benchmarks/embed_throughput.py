"""Throughput of ``Embedder.embed`` against ``SentenceTransformer.encode``, and achieved FLOP/s share.

Run:  python benchmarks/embed_throughput.py [--device auto|cpu|cuda] [--n 20000] [--words FILE]
          [--threads T] [--batch-tokens N] [--max-batch-size N] [--ours-also TOKENS:TEXTS[:CHUNK] ...]
          [--st-batch-size 32 ...] [--repeat 3] [--compare-cpu N] [--model SPEC]

Both paths run in this process on the same device (``--device``, default cpu; ``auto`` picks as the
audit does), with the same torch threads, after a warm-up each, on the same words (wordfreq's English
top list, alphabetic only, or the words of ``--words FILE``). Both include tokenization and the copy
of the results to host memory in their time. ``--ours-also`` times further (batch_tokens,
max_batch_size[, chunk_texts]) settings of ours beside the default (chunk 0: all texts in one chunk,
tokenized before any batch runs); ``--st-batch-size`` takes several sizes.

Both run the model in float32 (the Embedder has no half-precision mode). Model FLOPs of our run
(documented formula, forward pass only)::

    dense     = 2 * M * sum_i L_i          M = multiply-accumulates per token of the encoder's
                                             Linear layers (non-embedding weights: QKV, output,
                                             FFN); embeddings, LayerNorm, biases, GELU and the
                                             pooler (once per sequence) are left out
    attention = 4 * n_layers * h * sum_i L_i^2     (Q K^T and softmax(.) V, h = hidden size)
    total     = dense + attention

``L_i`` is the real (unpadded) token count of text i: that is useful work. The same formula
with each text's padded batch width is printed as "padded FLOPs" (work the hardware did).
The share is useful FLOP/s over the device's dense matmul rate measured here with torch: on CPU
float32 (2048^3, same threads, best of several); on CUDA float32 at torch's matmul precision (TF32
off unless something switched it on; printed) and, for scale, bf16 (8192^3, CUDA events).

On CUDA, ``--compare-cpu N`` also embeds the first N words on the CPU and prints the largest
cuda-vs-cpu difference of vectors (relative to the norm) and norms.
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


def matmul_rate(size: int = 2048, reps: int = 10) -> float:
    """Best dense float32 matmul FLOP/s on the CPU over a few rounds of ``reps`` square products."""
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


def timed(fn) -> tuple[float, float]:
    """(seconds, share of the CPUs other processes used meanwhile)."""
    load = OtherLoad()
    load.start()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, load.stop()


def _config(text: str) -> tuple[int, int, int | None]:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected TOKENS:TEXTS or TOKENS:TEXTS:CHUNK (e.g. 65536:8192), not {text!r}"
        ) from None


def _label(config) -> str:
    return ":".join(str(x) for x in config if x is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    ap.add_argument("--n", type=int, default=20000, help="number of words (default 20000)")
    ap.add_argument("--words", default=None, help="word-list file (default: wordfreq's English list)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for both paths")
    ap.add_argument(
        "--batch-tokens", type=int, default=None, help="padded tokens per batch (ours; default: Embedder's)"
    )
    ap.add_argument("--max-batch-size", type=int, default=1024, help="texts per batch at most (ours)")
    ap.add_argument(
        "--ours-also", type=_config, nargs="*", default=[], metavar="TOKENS:TEXTS[:CHUNK]",
        help="further batch_tokens:max_batch_size[:chunk_texts] settings of ours to time beside the default",
    )
    ap.add_argument(
        "--st-batch-size", type=int, nargs="+", default=[32], help="SentenceTransformer.encode batch_size(s)"
    )
    ap.add_argument(
        "--repeat", type=int, default=3, help="interleaved timed rounds; the best of each path counts"
    )
    ap.add_argument("--compare-cpu", type=int, default=0, metavar="N",
                    help="off the CPU: also embed the first N words on the CPU and print the largest difference")
    ap.add_argument("--model", default="minilm-l6")
    args = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from pipeline.embedding.batching import chunk_bounds
    from pipeline.embedding.embed import Embedder, pick_device
    from pipeline.embedding.models import get_spec, resolve_model

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    on_cuda = device.startswith("cuda")
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {args.threads}"
    )
    if on_cuda:
        props = torch.cuda.get_device_properties(device)
        print(
            f"device: {device} = {props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"{props.multi_processor_count} SMs, CUDA {torch.version.cuda}, TF32 matmuls {tf32_matmuls()}"
        )
    else:
        print(f"device: {device}")
    resolved = resolve_model(get_spec(args.model))
    emb = Embedder(
        resolved,
        device=device,
        threads=args.threads,
        batch_tokens=args.batch_tokens,
        max_batch_size=args.max_batch_size,
    )
    dtype = next(emb.model.parameters()).dtype
    st = SentenceTransformer(resolved.path, device=device, local_files_only=True)
    texts = words(args.n, args.words)
    configs = [(emb.batch_tokens, emb.max_batch_size, emb.chunk_texts), *args.ours_also]
    print(
        f"model: {resolved.spec.name} ({resolved.path}; dim {resolved.dim}, max_length {resolved.max_length}, "
        f"{sum(p.numel() for p in emb.model.parameters()) / 1e6:.1f} M parameters, {dtype}), {len(texts)} words; "
        f"ours batch_tokens:max_batch_size:chunk_texts {', '.join(map(_label, configs))} (first = headline); "
        f"ST batch_size {', '.join(map(str, args.st_batch_size))}"
    )

    default_chunk = emb.chunk_texts

    def use(config) -> None:
        emb.batch_tokens, emb.max_batch_size, chunk = config
        emb.chunk_texts = default_chunk if chunk is None else chunk

    def ours(config, items):
        use(config)
        return emb.embed(items)

    warm = texts[:2000]
    for config in configs:
        ours(config, warm)
    for bs in args.st_batch_size:
        st.encode(warm, batch_size=bs)

    # Interleaved rounds, best of each: every path sees the same background load, and a round
    # disturbed by other processes (printed) does not count against either.
    ours_s = [float("inf")] * len(configs)
    st_s = [float("inf")] * len(args.st_batch_size)
    peak, result, stats = 0.0, None, None
    for r in range(args.repeat):
        if not on_cuda:
            peak = max(peak, matmul_rate())
        line = []
        for k, config in enumerate(configs):
            out = []
            o, o_busy = timed(lambda config=config, out=out: out.append(ours(config, texts)))
            if k == 0:
                result, stats = out[0], emb.last_stats
            ours_s[k] = min(ours_s[k], o)
            line.append(f"ours {_label(config)} {o:.2f} s (other load {o_busy:.0%})")
        for k, bs in enumerate(args.st_batch_size):
            s, s_busy = timed(lambda bs=bs: st.encode(texts, batch_size=bs))
            st_s[k] = min(st_s[k], s)
            line.append(f"ST {bs} {s:.2f} s (other load {s_busy:.0%})")
        print(f"  round {r + 1}: " + ", ".join(line))
    use(configs[0])  # back to the headline setting

    n = len(texts)
    for k, config in enumerate(configs):
        label = "ours" if k == 0 else f"ours {_label(config)}"
        print(f"{label + ':':24s} {n / ours_s[k]:10.0f} items/s  ({ours_s[k]:.2f} s)")
    for k, bs in enumerate(args.st_batch_size):
        print(f"{f'SentenceTransformer {bs}:':24s} {n / st_s[k]:10.0f} items/s  ({st_s[k]:.2f} s)")
    for k, bs in enumerate(args.st_batch_size):
        print(f"ratio ours / ST {bs}: {st_s[k] / ours_s[0]:8.2f}x")
    tok_s = min(timed(lambda: emb._tokenize(texts))[0] for _ in range(2))
    chunks = len(chunk_bounds(n, emb.chunk_texts))
    how = "each tokenized while the one before runs" if chunks > 1 else "tokenized before any batch runs"
    print(
        f"tokenization alone (inside ours, all {n} texts at once, best of 2): {tok_s:.2f} s = "
        f"{tok_s / ours_s[0]:.0%} of ours' time (ours: {chunks} chunk(s) of up to {emb.chunk_texts} texts, {how})"
    )
    if emb._backend is not None:
        wall = cpu = float("inf")
        for _ in range(2):  # best of two: a 2-core machine shared with others is noisy
            c, t = time.process_time(), time.perf_counter()
            emb._backend.encode_batch(texts, add_special_tokens=True)
            wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
        print(f"  of which encode_batch (Rust, Python objects out): {wall:.2f} s wall, {cpu:.2f} s CPU (all threads)")

    real = result.n_tokens
    sizes, widths = np.array(stats.batch_shapes).T
    padded = np.repeat(widths, sizes)  # each text's batch width
    useful = model_flops(emb.model, real)
    done = model_flops(emb.model, padded)
    print(
        f"tokens: {real.sum()} real, {stats.padded_tokens} padded "
        f"({stats.padded_tokens / max(real.sum(), 1) - 1:.1%} padding), {stats.batches} batches (ours, default)"
    )
    print(f"model FLOPs: {useful / 1e9:.1f} GFLOP useful, {done / 1e9:.1f} GFLOP padded")
    achieved = useful / ours_s[0]
    if on_cuda:
        rates = {"fp32": cuda_matmul_rate(torch.float32), "bf16": cuda_matmul_rate(torch.bfloat16)}
        print(f"dense matmul rates (8192^3, CUDA events): fp32 {rates['fp32'] / 1e12:.1f} TFLOP/s "
              f"(TF32 {tf32_matmuls()}), bf16 {rates['bf16'] / 1e12:.1f} TFLOP/s")
        print(
            f"achieved (model in {dtype}): {achieved / 1e12:.2f} TFLOP/s useful = "
            f"{achieved / rates['fp32']:.3f} of the fp32 rate ({done / ours_s[0] / rates['fp32']:.3f} counting "
            f"padded work), {achieved / rates['bf16']:.4f} of the bf16 rate"
        )
    else:
        print(f"dense fp32 matmul rate (2048^3, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s")
        print(
            f"achieved: {achieved / 1e9:.1f} GFLOP/s useful = {achieved / peak:.2f} of matmul rate "
            f"({done / ours_s[0] / peak:.2f} counting padded work)"
        )

    if args.compare_cpu and device != "cpu":
        k = min(args.compare_cpu, n)
        on_cpu = Embedder(resolved, device="cpu", threads=args.threads).embed(texts[:k])
        norms_cpu = on_cpu.norms
        dv = np.abs(result.vectors[:k].astype(np.float64) - on_cpu.vectors).max(axis=1) / norms_cpu
        dn = np.abs(result.norms[:k] - norms_cpu) / norms_cpu
        same_tokens = bool((result.n_tokens[:k] == on_cpu.n_tokens).all())
        print(
            f"{device} vs cpu, first {k} words: max |dv|/||v|| {dv.max():.2e}, max |dnorm|/norm {dn.max():.2e}, "
            f"token counts {'identical' if same_tokens else 'DIFFER'}"
        )


if __name__ == "__main__":
    main()
