"""Throughput of ``Embedder.embed`` per precision and text source, against ``SentenceTransformer.encode``.

Run:  python benchmarks/embed_throughput.py [--sources words cranfield chaosnli] [--n 20000] [--n-passages 2000]
          [--precision float32 bfloat16] [--autocast] [--device cpu|cuda|auto] [--threads T] [--model SPEC]
          [--st-batch-size 32 ...] [--st-sources SRC ...] [--repeat 2] [--batch-tokens N] [--max-batch-size N]
          [--ours-also TOKENS:TEXTS[:CHUNK] ...] [--compare-cpu N] [--tokenize-only] [--words FILE]

Default: MiniLM on the CPU, 20,000 words and 2,000 Cranfield passages (texts: benchmarks/embed_common.py), ours
in float32 and bfloat16, sentence-transformers ``encode`` (batch 32, float32) on the same texts. Every path runs
in this process on the same device and threads, after a warm-up, in interleaved rounds (the order reversed every
other round); the best round of each counts, and the share of the CPUs other processes used is printed per run.
Times include tokenization and the copy of the results to host memory. Per source it prints items/s, bf16 ÷
fp32, ours ÷ ST, the norms' largest relative difference bf16 vs fp32, the padding share of the length-sorted
token-budget batches, the model FLOP/s as a share of the machine's dense matmul rate measured here in the same
dtype (CPU: 2048^3, same threads; CUDA: 8192^3, CUDA events, TF32 as torch has it), and the "device waiting share":
the seconds ``embed`` waited for a chunk's tokens over its wall time (on CPU tokenization is not overlapped, so
this is its whole share; on a GPU it is the time the next chunk's tokens were late). ``--autocast`` also times
bfloat16 as ``torch.autocast`` over the float32 model (the alternative to the cast model the Embedder uses).
Then tokenization alone per source: the former path (``encode_batch`` with offsets + per-text lists) vs the
current one (:class:`pipeline.embedding.tokenize.TextTokenizer`), and the Rust encode inside it.
On CUDA, ``--compare-cpu N`` embeds the first N texts of the first source on the CPU too and prints the largest
cuda-vs-cpu differences (vectors relative to the norm, norms).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from embed_common import (  # noqa: E402 - a sibling module, importable once its folder is on the path
    SHARED_DATA,
    SOURCES,
    cuda_matmul_rate,
    load_texts,
    matmul_rate,
    model_flops,
    tf32_matmuls,
    timed,
)

from pipeline.embedding.batching import Tokens  # noqa: E402 - numpy only
from pipeline.embedding.precision import cpu_name  # noqa: E402 - no torch at import

__all__ = ["cuda_matmul_rate", "main"]  # worker_scaling.py imports cuda_matmul_rate from here


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


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    ap.add_argument("--sources", nargs="+", choices=SOURCES, default=["words", "cranfield"])
    ap.add_argument("--n", type=int, default=20000, help="words (default 20000)")
    ap.add_argument("--n-passages", type=int, default=2000, help="Cranfield passages / ChaosNLI premises")
    ap.add_argument("--words", default=None, help="word-list file (default: wordfreq's English list)")
    ap.add_argument("--shared-data", type=Path, default=SHARED_DATA, help="folder with cranfield/ and chaosnli/")
    ap.add_argument("--precision", nargs="+", default=["float32", "bfloat16"],
                    choices=["float32", "bfloat16", "float16"], help="ours' precisions; the first is the baseline")
    ap.add_argument("--autocast", action="store_true", help="also bfloat16 as torch.autocast over float32 weights")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads for every path")
    ap.add_argument("--batch-tokens", type=int, default=None, help="padded tokens per batch (default: Embedder's)")
    ap.add_argument("--max-batch-size", type=int, default=1024, help="texts per batch at most (ours)")
    ap.add_argument("--ours-also", type=_config, nargs="*", default=[], metavar="TOKENS:TEXTS[:CHUNK]",
                    help="further batch_tokens:max_batch_size[:chunk_texts] of ours, baseline precision")
    ap.add_argument("--st-batch-size", type=int, nargs="*", default=[32], help="encode batch_size(s); none: no ST")
    ap.add_argument("--st-sources", nargs="*", choices=SOURCES, default=None, help="ST on these (default: all)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved timed rounds; the best of each path counts")
    ap.add_argument("--compare-cpu", type=int, default=0, metavar="N",
                    help="off the CPU: also embed the first N texts on the CPU and print the largest difference")
    ap.add_argument("--tokenize-only", action="store_true", help="only time tokenization (no model runs)")
    ap.add_argument("--model", default="minilm-l6")
    return ap.parse_args()


def _tokenize_before(tokenizer, texts):
    """The tokenization of the commit before issue 19: ``encode_batch`` (offsets and all), per-text lists."""

    encs = tokenizer.backend.encode_batch(texts, add_special_tokens=True)
    types = [e.type_ids for e in encs] if tokenizer.types_needed else None
    tokens = Tokens.from_lists([e.ids for e in encs], types)
    for i in np.flatnonzero(tokens.lengths >= tokenizer.max_length):
        tokens.truncated[i] = bool(encs[i].overflowing)
    return tokens


def _tokenization(emb, texts_by_source) -> None:
    tok = emb.tokenizer
    if tok.backend is None:
        print("tokenization: this model has no Rust tokenizer backend")
        return
    encode = getattr(tok.backend, "encode_batch_fast", None)
    for source, texts in texts_by_source.items():
        runs = {"before (encode_batch + lists)": lambda t=texts: _tokenize_before(tok, t),
                "now (TextTokenizer)": lambda t=texts: tok(t),
                "of which Rust encode": (lambda t=texts: encode(t, add_special_tokens=True)) if encode else None}
        best = {k: min(timed(f)[0] for _ in range(3)) for k, f in runs.items() if f is not None}
        before, now = best["before (encode_batch + lists)"], best["now (TextTokenizer)"]
        rust = best.get("of which Rust encode", now)
        print(f"tokenization alone, {source} ({len(texts)} texts, best of 3): before {before:.3f} s, now {now:.3f} s "
              f"(x{before / now:.2f}); Rust encode_batch_fast {rust:.3f} s, Python part {max(now - rust, 0):.3f} s "
              f"= {max(now - rust, 0) / now:.0%}")


def main() -> None:
    args = _args()
    import torch  # seconds to import: --help stays fast

    from pipeline.embedding.embed import Embedder, pick_device
    from pipeline.embedding.models import get_spec, resolve_model

    torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    on_cuda = device.startswith("cuda")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, threads {args.threads}")
    if on_cuda:
        props = torch.cuda.get_device_properties(device)
        print(f"device: {device} = {props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} "
              f"SMs, CUDA {torch.version.cuda}, TF32 matmuls {tf32_matmuls()}")
    else:
        print(f"device: {device}")
    resolved = resolve_model(get_spec(args.model))
    kw = {"device": device, "threads": args.threads, "batch_tokens": args.batch_tokens,
          "max_batch_size": args.max_batch_size}
    ours = {p: Embedder(resolved, precision=p, **kw) for p in args.precision}
    base = args.precision[0]
    emb = ours[base]
    texts = {s: load_texts(s, args.n, args.n_passages, args.words, args.shared_data) for s in args.sources}
    print(f"model: {resolved.spec.name} ({resolved.path}; dim {resolved.dim}, max_length {resolved.max_length}, "
          f"{sum(p.numel() for p in emb.model.parameters()) / 1e6:.1f} M parameters)")
    for s, t in texts.items():
        lengths = emb.tokenizer(t).lengths
        print(f"texts: {s}: {len(t)}, tokens per text mean {lengths.mean():.1f}, max {lengths.max()}, "
              f"{int((lengths >= resolved.max_length).sum())} at max_length")
    if args.tokenize_only:
        _tokenization(emb, texts)
        return

    # each variant returns (result, the embedder's stats of that call); ST's stats are None
    variants = {f"ours {p}": (lambda t, e=e: (e.embed(t), e.last_stats)) for p, e in ours.items()}
    if args.autocast:
        f32 = ours.get("float32") or Embedder(resolved, **kw)

        def autocast(t):
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
                return f32.embed(t), f32.last_stats

        variants["ours bfloat16 autocast"] = autocast
    default = (emb.batch_tokens, emb.max_batch_size, emb.chunk_texts)

    def with_config(config):
        def run(t):
            emb.batch_tokens, emb.max_batch_size, chunk = config
            emb.chunk_texts = default[2] if chunk is None else chunk
            try:
                return emb.embed(t), emb.last_stats
            finally:
                emb.batch_tokens, emb.max_batch_size, emb.chunk_texts = default
        return run

    for config in args.ours_also:
        variants[f"ours {base} {_label(config)}"] = with_config(config)
    if args.st_batch_size:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(resolved.path, device=device, local_files_only=True)
        st.max_seq_length = resolved.max_length  # the same truncation as ours
        st_sources = args.sources if args.st_sources is None else args.st_sources
        for bs in args.st_batch_size:
            variants[f"ST {bs} float32"] = lambda t, bs=bs: (st.encode(t, batch_size=bs), None)
    else:
        st_sources = []
    plan = [(s, v) for s in args.sources for v in variants if not v.startswith("ST") or s in st_sources]

    for s, v in plan:  # warm-up
        variants[v](texts[s][:200])
    best = {key: float("inf") for key in plan}
    out, peak = {}, {}
    for r in range(args.repeat):
        if not on_cuda:
            peak["float32"] = max(peak.get("float32", 0.0), matmul_rate(torch.float32))
            if "bfloat16" in args.precision:
                peak["bfloat16"] = max(peak.get("bfloat16", 0.0), matmul_rate(torch.bfloat16))
        line = []
        for s, v in plan if r % 2 == 0 else plan[::-1]:
            got = []
            sec, busy = timed(lambda s=s, v=v, got=got: got.append(variants[v](texts[s])))
            if v.startswith("ours"):
                out[(s, v)] = got[0]
            best[(s, v)] = min(best[(s, v)], sec)
            line.append(f"{s}/{v} {sec:.2f} s ({busy:.0%} other load)")
        print(f"  round {r + 1}: " + ", ".join(line), flush=True)
    if on_cuda:
        peak = {"float32": cuda_matmul_rate(torch.float32), "bfloat16": cuda_matmul_rate(torch.bfloat16)}
        print(f"dense matmul rates (8192^3, CUDA events): fp32 {peak['float32'] / 1e12:.1f} TFLOP/s "
              f"(TF32 {tf32_matmuls()}), bf16 {peak['bfloat16'] / 1e12:.1f} TFLOP/s")
    else:
        print(f"dense matmul rates (2048^3, {args.threads} threads, best of the rounds): "
              + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items()))
    _report(args, texts, variants, best, out, peak, ours, base, st_sources)
    _tokenization(emb, texts)
    if args.compare_cpu and device != "cpu":
        _compare_cpu(args, resolved, texts[args.sources[0]], out, ours)


def _report(args, texts, variants, best, out, peak, ours, base, st_sources) -> None:
    unit, scale = ("TFLOP/s", 1e12) if peak.get("float32", 0) > 5e12 else ("GFLOP/s", 1e9)
    for s in args.sources:
        n = len(texts[s])
        print(f"== {s}: {n} texts")
        for v in variants:
            if (s, v) in best:
                print(f"  {v + ':':32s} {n / best[(s, v)]:10.1f} items/s ({best[(s, v)]:.2f} s)")
        base_s = best[(s, f"ours {base}")]
        for p in ours:
            if p != base:
                print(f"  {p} / {base} throughput: {base_s / best[(s, f'ours {p}')]:.2f}x")
        if args.autocast:
            print(f"  bfloat16 autocast / {base}: {base_s / best[(s, 'ours bfloat16 autocast')]:.2f}x")
        for bs in args.st_batch_size if s in st_sources else []:
            print(f"  ours {base} / ST {bs} (float32): {best[(s, f'ST {bs} float32')] / base_s:.2f}x")
        ref, _ = out[(s, f"ours {base}")]
        for v, (res, _) in ((v, out[(s, v)]) for v in variants if (s, v) in out and v != f"ours {base}"):
            rel = np.abs(res.norms / ref.norms - 1)
            dv = np.linalg.norm(res.vectors.astype(np.float64) - ref.vectors, axis=1) / ref.norms
            print(f"  norms {v.removeprefix('ours ')} vs {base}: largest relative error {rel.max():.2e} "
                  f"(mean {rel.mean():.2e}); vectors: largest |dv|/|v| {dv.max():.2e}")
        for p, e in ours.items():
            res, stats = out[(s, f"ours {p}")]
            real = res.n_tokens
            sizes, widths = np.array(stats.batch_shapes).T
            useful, padded = model_flops(e.model, real), model_flops(e.model, np.repeat(widths, sizes))
            rate = peak.get(p if p in peak else "float32", 0.0)
            share = useful / best[(s, f"ours {p}")] / rate if rate else float("nan")
            print(f"  ours {p}: {real.sum()} real tokens, {stats.padded_tokens} padded "
                  f"(padding share {1 - real.sum() / max(stats.padded_tokens, 1):.1%}), {stats.batches} batches; "
                  f"model {useful / best[(s, f'ours {p}')] / scale:.1f} {unit} useful = {share:.2f} of the "
                  f"{'float32' if p not in peak else p} dense rate ({padded / useful - 1:+.1%} counting pads); "
                  f"device waiting share {stats.waiting_share:.1%} ({stats.tokenize_wait_s:.2f} of "
                  f"{stats.wall_s:.2f} s waiting for tokens)")


def _compare_cpu(args, resolved, texts, out, ours) -> None:
    from pipeline.embedding.embed import Embedder  # imports torch

    k = min(args.compare_cpu, len(texts))
    on_cpu = Embedder(resolved, device="cpu", threads=args.threads).embed(texts[:k])
    for p in ours:
        res, _ = out[(args.sources[0], f"ours {p}")]
        dv = np.abs(res.vectors[:k].astype(np.float64) - on_cpu.vectors).max(axis=1) / on_cpu.norms
        dn = np.abs(res.norms[:k] - on_cpu.norms) / on_cpu.norms
        same = bool((res.n_tokens[:k] == on_cpu.n_tokens).all())
        print(f"{p} on the device vs float32 on the cpu, first {k} {args.sources[0]}: max |dv|/||v|| {dv.max():.2e}, "
              f"max |dnorm|/norm {dn.max():.2e}, token counts {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"benchmark wall time {time.perf_counter() - start:.0f} s")
