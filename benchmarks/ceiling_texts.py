"""The texts of ``benchmarks/pipeline_ceiling.py``: two deterministic sets of template sentences.

``same-mix`` (the default since issue 36's ninth part): every item is a pair sentence, the template filled with
``w1 and a w2`` (``a photo of a house and a tree.``), its template, first and second word drawn uniformly at
random (wordfreq's 289,023 ASCII alphabetic English words, 4 templates) in chunks of ``CHUNK`` items, chunk ``c``
from ``numpy.random.default_rng([SEED, c])``. The first ``n`` items are the same whatever the largest size, and
every size has the same mix of texts: a benchmark that compares 1 M with 10 M items measures size, not text
length. Id ``<template>:<w1>+<w2>/<position>`` (unique even when a pair repeats); property ``zipf``: the first
word's Zipf frequency.

``singles-then-pairs`` (the set of every earlier run, kept to compare with them): up to 1,156,092 items it is
exactly ``pipeline/probes/scale.write_probe_file``'s (``<template>:<word>``, ``This is a house.``); beyond that,
word pairs in order: for the second word w2 taken in frequency order, every first word w1 != w2 in frequency
order, each in every template in turn, id ``<template>:<w1>+<w2>``. Its 1 M items are all one-word sentences
and 88% of its 10 M are pair sentences ~1.5x longer, so a ratio 10 M / 1 M on it mixes size with text length.
"""

from __future__ import annotations

MIXES = ("same-mix", "singles-then-pairs")
PAIR_JOIN = " and a "
CHUNK = 1 << 20
SEED = 36


def english_words() -> list[str]:
    """Every word :func:`pipeline.probes.scale.english_words` draws from, most frequent first (same rule)."""
    from wordfreq import top_n_list

    return [w for w in top_n_list("en", 10**7) if w.isascii() and w.isalpha()]


def ceiling_sentences(n: int, mix: str = "same-mix"):
    """The first ``n`` items of the set ``mix`` (see the module docstring) as a probe-file frame."""
    if mix == "same-mix":
        return _same_mix(n)
    if mix == "singles-then-pairs":
        return _singles_then_pairs(n)
    raise ValueError(f"unknown text mix {mix!r}; choose one of {', '.join(MIXES)}")


def _vocabulary():
    import polars as pl
    from wordfreq import zipf_frequency

    words = english_words()
    return words, pl.Series("zipf", [zipf_frequency(w, "en") for w in words], pl.Float64)


def _forms():
    import polars as pl

    from pipeline.probes.templates import TEMPLATES

    return pl.DataFrame({
        "key": list(TEMPLATES),
        "prefix": [t.partition("{}")[0] for t in TEMPLATES.values()],
        "suffix": [t.partition("{}")[2] for t in TEMPLATES.values()],
    })


def _same_mix(n: int):
    import numpy as np
    import polars as pl

    words, zipf = _vocabulary()
    forms, vocab = _forms(), pl.Series("w", words)
    source = (f"wordfreq English word pairs ('w1 and a w2') x normaudit sentence templates, drawn uniformly "
              f"(seed {SEED}, chunks of {CHUNK:,})")
    chunks = []
    for c in range(-(-n // CHUNK)):
        rng = np.random.default_rng([SEED, c])
        size = min(CHUNK, n - c * CHUNK)
        # a whole chunk's draws, then its first ``size``: the first n items do not depend on n
        form = rng.integers(0, forms.height, CHUNK)[:size]
        w1, w2 = rng.integers(0, len(words), CHUNK)[:size], rng.integers(0, len(words), CHUNK)[:size]
        chunk = pl.DataFrame({
            "key": forms["key"].gather(form), "prefix": forms["prefix"].gather(form),
            "suffix": forms["suffix"].gather(form), "w1": vocab.gather(w1), "w2": vocab.gather(w2),
            "zipf": zipf.gather(w1), "pos": pl.Series(np.arange(c * CHUNK, c * CHUNK + size)).cast(pl.String),
        })
        chunks.append(chunk.select(
            item_id=pl.concat_str("key", pl.lit(":"), "w1", pl.lit("+"), "w2", pl.lit("/"), "pos"),
            text=pl.concat_str("prefix", "w1", pl.lit(PAIR_JOIN), "w2", "suffix"),
            kind=pl.lit("sentence"), lang=pl.lit("en"), source=pl.lit(source), zipf="zipf",
        ))
    return pl.concat(chunks)


def _singles_then_pairs(n: int):
    import polars as pl

    from pipeline.probes.scale import template_sentences

    words, zipf = _vocabulary()
    forms = _forms().with_row_index("form")
    singles = len(words) * forms.height
    first = template_sentences(min(n, singles))
    if n <= singles:
        return first
    source = f"{first['source'][0]}; beyond {singles:,} items, word pairs ('w1 and a w2')"
    vocab = pl.DataFrame({"w1": words, "zipf": zipf}).with_row_index("rank")
    grid = vocab.join(forms, how="cross").sort("rank", "form")
    blocks, have = [first], singles
    for w2 in words:  # one block per second word, most frequent first, until n items
        block = grid.filter(pl.col("w1") != w2).select(
            item_id=pl.concat_str("key", pl.lit(":"), "w1", pl.lit(f"+{w2}")),
            text=pl.concat_str("prefix", "w1", pl.lit(f"{PAIR_JOIN}{w2}"), "suffix"),
            kind=pl.lit("sentence"), lang=pl.lit("en"), source=pl.lit(source), zipf="zipf",
        ).head(n - have)
        blocks.append(block)
        have += block.height
        if have >= n:
            break
    return pl.concat(blocks, how="vertical_relaxed")
