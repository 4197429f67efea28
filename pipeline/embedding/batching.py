"""The host side of embedding: texts in chunks, their tokens as flat arrays, and padded batches.

:class:`pipeline.embedding.embed.Embedder` tokenizes a chunk of texts into one flat id array (:class:`Tokens`,
no per-text Python lists kept), plans its batches (:func:`plan_batches`: longest first, each under a
padded-token budget) and packs every batch of the chunk into one padded array (:func:`pack_batches`),
so a device gets a whole chunk in one copy and each batch is a view of it. :func:`computed_ahead`
tokenizes the next chunk on a helper thread meanwhile (on a GPU; a CPU Embedder tokenizes its chunks in turn).
numpy only: no torch here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

__all__ = ["Packed", "Tokens", "chunk_bounds", "computed_ahead", "pack_batches", "plan_batches"]


@dataclass(frozen=True)
class Tokens:
    """Token ids of consecutive texts, back to back, with each text's length and truncation flag."""

    ids: np.ndarray  # int64 [total]
    type_ids: np.ndarray | None  # int64 [total]; None where every type id is 0
    lengths: np.ndarray  # int32 [n], tokens per text incl. special tokens, after truncation
    truncated: np.ndarray  # bool [n], the text had more tokens than the model's max_length

    @classmethod
    def from_lists(
        cls, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None
    ) -> Tokens:
        """Flatten per-text id lists (and type id lists, or None for all 0); truncation flags start False."""
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        total = int(lengths.sum(dtype=np.int64))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=total)
        types = None
        if type_ids is not None:
            types = np.fromiter(itertools.chain.from_iterable(type_ids), dtype=np.int64, count=total)
        return cls(flat, types, lengths, np.zeros(len(lengths), dtype=bool))

    @property
    def starts(self) -> np.ndarray:
        """int64 [n]: where each text's ids begin in :attr:`ids`."""
        return np.cumsum(self.lengths, dtype=np.int64) - self.lengths


@dataclass(frozen=True)
class Packed:
    """Every batch of a chunk, padded to its own width and laid out back to back in plan order."""

    arrays: np.ndarray  # int64 [k, sum of size * width]: input ids, attention mask, then type ids if asked for
    rows: np.ndarray  # int64 [n]: the text (index into the chunk) of each packed row, in plan order
    shapes: list[tuple[int, int]]  # (texts, padded width) of each batch
    real: list[int]  # real (unpadded) tokens of each batch


def chunk_bounds(n: int, chunk_texts: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive chunks covering ``range(n)``.

    One chunk where ``chunk_texts`` is 0 or at least ``n``. Otherwise the chunks grow from
    ``chunk_texts // 8``, doubling, to ``chunk_texts``: the device waits only for the first, small
    chunk's tokens, while later chunks are large enough that their batches stay full.
    """
    if chunk_texts <= 0 or n <= chunk_texts:
        return [(0, n)]
    bounds, start, size = [], 0, max(1, chunk_texts // 8)
    while start < n:
        stop = min(n, start + size)
        bounds.append((start, stop))
        start, size = stop, min(chunk_texts, 2 * size)
    return bounds


def computed_ahead(fn: Callable, args: Sequence, ahead: bool = True) -> Iterator:
    """``fn(a)`` for each of ``args`` in order, the next one computed on a helper thread meanwhile.

    While the caller works on one result (runs a chunk's batches), the next is under way: this
    overlaps tokenization with device work because HF tokenizers' ``encode_batch`` releases the GIL.
    An exception in ``fn`` is raised here, when its result is due; closing the iterator early waits
    for the one call under way. A single argument, or ``ahead=False``, runs each call on the calling thread
    when its result is due.
    """
    if not ahead or len(args) <= 1:
        yield from map(fn, args)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="normaudit-tokenize") as pool:
        future = pool.submit(fn, args[0])
        for k in range(len(args)):
            result = future.result()
            if k + 1 < len(args):
                future = pool.submit(fn, args[k + 1])
            yield result


def plan_batches(lengths: np.ndarray, batch_tokens: int, max_batch_size: int) -> list[np.ndarray]:
    """Batches of text indices: longest first, each under the padded-token budget and the size cap."""
    order = np.argsort(-lengths, kind="stable")
    batches, start, n = [], 0, len(order)
    while start < n:
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_batch_size, batch_tokens // longest, n - start))
        batches.append(order[start : start + size])
        start += size
    return batches


def pack_batches(tokens: Tokens, batches: list[np.ndarray], pad_id: int, with_types: bool) -> Packed:
    """Pad each batch to its longest text (at least 1) and lay all of them out in one array.

    Row ``r`` of the packed batches holds text ``rows[r]``: its ids, then ``pad_id`` up to the batch's
    width; the mask is 1 on real tokens. Built with index arithmetic over all tokens at once, not a
    Python loop per text (that loop was most of the host time per batch).
    """
    rows = np.concatenate(batches).astype(np.int64, copy=False)
    sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
    firsts = np.cumsum(sizes) - sizes
    lens = tokens.lengths[rows].astype(np.int64)
    widths = np.maximum(np.maximum.reduceat(lens, firsts), 1)
    real = np.add.reduceat(lens, firsts)
    row_width = np.repeat(widths, sizes)
    row_start = np.cumsum(row_width) - row_width
    # each real token's position within its text, then its place in the packed rows and in tokens.ids
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    dest = np.repeat(row_start, lens) + within
    src = np.repeat(tokens.starts[rows], lens) + within
    arrays = np.zeros((3 if with_types else 2, int(row_width.sum())), dtype=np.int64)
    if pad_id:
        arrays[0] = pad_id
    arrays[0, dest] = tokens.ids[src]
    arrays[1, dest] = 1
    if with_types and tokens.type_ids is not None:
        arrays[2, dest] = tokens.type_ids[src]
    shapes = [(int(s), int(w)) for s, w in zip(sizes, widths, strict=True)]
    return Packed(arrays, rows, shapes, [int(r) for r in real])
