"""Would a worker gain by gating and writing one shard's part while the next shard's forward pass runs?

Run:  python benchmarks/gate_overlap.py [--model minilm-l6] [--device auto] [--rows 65536] [--texts 3072]

A worker runs one shard at a time: forward passes, then the part's table, its Parquet bytes, their sha256 and the
``embeddings`` GX suite (what ``embed_shard`` does after the model). Letting two shards in flight overlap the
second's forward with the first's gate only pays if the two together get more done than one after the other.
This script measures it in one process, on one synthetic part of ``--rows`` rows (the model's width, template
sentences) and ``--texts`` template sentences to embed:

1. the gate alone (parts per second) and the forward alone (items per second, before and after);
2. both at once: the gate in a loop on a second thread while the forward runs;
3. ``combined = forward_together / forward_alone + gate_together / gate_alone``: above 1 the overlap gains that
   fraction of a stage; 1 or below, the two only take turns (on a 2-core CPU the forward's two torch threads and
   the gate's Python share the cores and the GIL).

On a GPU the forward leaves the CPU mostly free and the answer can differ: run it there before building the
overlap for GPU workers.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.audit.steps import resolve  # noqa: E402
from pipeline.embedding.embed import Embedder  # noqa: E402
from pipeline.probes.scale import template_sentences  # noqa: E402
from pipeline.quality.suites import validate_embeddings  # noqa: E402
from pipeline.storage.parts import embeddings_table, encode_table  # noqa: E402
from pipeline.storage.shards import Shard  # noqa: E402
from pipeline.storage.store import sha256_bytes  # noqa: E402

REPS = 4  # gates timed alone, before and after the overlap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rows", type=int, default=65_536, help="rows of the part the gate checks (a shard)")
    ap.add_argument("--texts", type=int, default=3_072, help="texts each timed forward embeds")
    args = ap.parse_args()

    frame = template_sentences(args.rows + args.texts)
    ids, texts = frame["item_id"].to_list()[: args.rows], frame["text"].to_list()[: args.rows]
    to_embed = frame["text"].to_list()[args.rows :]
    embedder = Embedder(resolve(args.model), device=args.device)
    embedder.embed(to_embed[:256])  # warm
    dim = embedder.embed(to_embed[:2]).vectors.shape[1]
    vectors = np.random.default_rng(0).standard_normal((args.rows, dim)).astype(np.float32)
    result = types.SimpleNamespace(vectors=vectors, norms=np.linalg.norm(vectors, axis=1),
                                   n_tokens=np.full(args.rows, 9, np.int32), truncated=np.zeros(args.rows, bool))

    def gate_once() -> None:
        shard = Shard("overlap", "s0", 0, ids, texts)
        table = embeddings_table("m", "r", shard, result)
        data = encode_table(table)
        sha256_bytes(data)
        validate_embeddings(table, ids, dim, "float32", "m", "r", "overlap", {}, shard.text_sha256)

    def forward() -> float:
        t = time.perf_counter()
        embedder.embed(to_embed)
        return len(to_embed) / (time.perf_counter() - t)

    gate_once()  # imports and GX's first context
    forward_before = forward()
    t = time.perf_counter()
    for _ in range(REPS):
        gate_once()
    gate_alone = REPS / (time.perf_counter() - t)

    stop, gated = threading.Event(), [0]

    def gate_loop() -> None:
        while not stop.is_set():
            gate_once()
            gated[0] += 1

    thread = threading.Thread(target=gate_loop)
    t = time.perf_counter()
    thread.start()
    forward_together = forward()
    stop.set()
    thread.join()
    gate_together = gated[0] / (time.perf_counter() - t)
    forward_after = forward()
    t = time.perf_counter()
    for _ in range(REPS):
        gate_once()
    gate_alone = (gate_alone + REPS / (time.perf_counter() - t)) / 2
    forward_alone = (forward_before + forward_after) / 2

    print(f"model {args.model} on {embedder.device}; part of {args.rows:,} rows x {dim}; {len(to_embed):,} texts")
    print(f"gate (table, Parquet, sha256, GX suite): alone {gate_alone:.2f} parts/s, beside a forward "
          f"{gate_together:.2f} parts/s")
    print(f"forward: alone {forward_before:.0f} / {forward_after:.0f} items/s, beside the gate "
          f"{forward_together:.0f} items/s")
    combined = forward_together / forward_alone + gate_together / gate_alone
    print(f"combined = {forward_together / forward_alone:.2f} + {gate_together / gate_alone:.2f} = {combined:.2f} "
          f"({'the overlap gains' if combined > 1.05 else 'no gain from overlapping'})")


if __name__ == "__main__":
    main()
