"""A reproducible probe set of any size, built offline: English words inside sentence templates.

The words are wordfreq's English list in frequency order (``top_n_list("en")``), keeping the ASCII
alphabetic ones (no digits, apostrophes or other scripts, so every word is spelled by any English
vocabulary); each word goes into every template of :data:`pipeline.probes.templates.TEMPLATES` in turn
("This is a house.", "a photo of a house.", ...). The first ``n`` sentences of that order are the set:
1,000,000 items are the 250,000 most frequent such words x 4 templates. The same wordfreq version gives
the same texts, ids and order, on any machine, without a network.

Every item is a ``sentence`` with the property ``zipf``: its word's wordfreq Zipf (the frequency of the
sentence's only varying word), so ``norm_vs_property`` and ``norm_by_bin`` have a frequency to work with.

:func:`write_probe_file` writes the set as a Parquet probe file for ``normaudit audit --probes FILE``:
the set is audited exactly as a user's own file is (its name is the file's stem).
"""

from __future__ import annotations

import math
from importlib.metadata import version

import polars as pl

from pipeline.probes.base import ProbeInputError
from pipeline.probes.templates import TEMPLATES


def english_words(count: int) -> list[str]:
    """The ``count`` most frequent ASCII alphabetic words of wordfreq's English list, most frequent first."""
    from wordfreq import top_n_list  # lazy: its word lists load on first use

    words = [w for w in top_n_list("en", 10**7) if w.isascii() and w.isalpha()]
    if count > len(words):
        raise ProbeInputError(
            f"wordfreq {version('wordfreq')} has {len(words):,} ASCII alphabetic English words; at "
            f"{len(TEMPLATES)} templates each that is at most {len(words) * len(TEMPLATES):,} sentences. "
            "Ask for fewer items."
        )
    return words[:count]


def template_sentences(n: int) -> pl.DataFrame:
    """The first ``n`` items: columns ``item_id`` (``<template key>:<word>``), ``text``, ``kind``, ``lang``,
    ``source`` and ``zipf``, word by word in frequency order, each word in every template in turn."""
    from wordfreq import zipf_frequency  # lazy: see english_words

    if n < 1:
        raise ProbeInputError(f"a probe set needs at least one item; got n={n}.")
    keys = list(TEMPLATES)
    words = english_words(math.ceil(n / len(keys)))
    zipf = [zipf_frequency(w, "en") for w in words]
    parts = [template.partition("{}") for template in TEMPLATES.values()]
    ids, texts, values = [], [], []
    for word, z in zip(words, zipf, strict=True):
        for key, (prefix, _, suffix) in zip(keys, parts, strict=True):
            ids.append(f"{key}:{word}")
            texts.append(f"{prefix}{word}{suffix}")
            values.append(z)
    del ids[n:], texts[n:], values[n:]
    source = f"wordfreq {version('wordfreq')} English words x normaudit sentence templates"
    return pl.DataFrame({"item_id": ids, "text": texts, "zipf": pl.Series(values, dtype=pl.Float64)}).select(
        "item_id", "text", kind=pl.lit("sentence"), lang=pl.lit("en"), source=pl.lit(source), zipf="zipf",
    )


def write_probe_file(path: str, n: int) -> int:
    """Write :func:`template_sentences` ``(n)`` as a Parquet probe file at ``path``; returns the rows written."""
    if not path.lower().endswith(".parquet"):
        raise ProbeInputError(f"{path}: the probe file must end in .parquet (the audit reads it by its extension).")
    frame = template_sentences(n)
    frame.write_parquet(path)
    return frame.height
