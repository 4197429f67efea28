"""Word frequency (wordfreq Zipf) for word probes and for the whole-word tokens of a model's vocabulary.

Zipf is log10 of occurrences per billion words (wordfreq's blend of corpora), so 7 is "the" and 1 is once
per 100 million words. A Zipf of 0 means wordfreq does not know the word: it is a floor, not a
measurement, so such words get no ``zipf`` property at all (an analysis then leaves them out) rather
than a value that would sit below every real one.

Only single words get a Zipf: wordfreq scores a phrase by its rarest word (roughly), which would put
"the like" next to "the" (see :mod:`pipeline.probes.wordnet`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import polars as pl

from pipeline.probes.base import ProbeSet

ZIPF = "zipf"
# BERT WordPiece continues a word with "##"; SentencePiece (T5, XLM-R) starts one with "▁"; byte-level BPE
# (GPT-2, RoBERTa, CLIP's text tower is similar) starts one with "Ġ".
_WORDPIECE_CONTINUATION = "##"
_WORD_START_MARKERS = ("▁", "Ġ")
_SINGLE_WORD = re.compile(r"\S+")


@lru_cache(maxsize=1)
def _languages() -> frozenset[str]:
    from wordfreq import available_languages

    return frozenset(available_languages())


def zipf_values(words: Sequence[str], lang: str = "en") -> list[float | None]:
    """wordfreq Zipf of each single word in ``lang``; ``None`` for phrases and for words wordfreq lacks.

    ``lang`` ``"und"`` (not given) counts as English; a language wordfreq does not cover gives all ``None``.
    """
    from wordfreq import zipf_frequency

    lang = "en" if lang in ("und", "", None) else lang
    if lang not in _languages():
        return [None] * len(words)
    out: list[float | None] = []
    for w in words:
        z = zipf_frequency(w, lang) if w and _SINGLE_WORD.fullmatch(w) else 0.0
        out.append(z if z > 0 else None)
    return out


def zipf_properties(items: pl.DataFrame) -> pl.DataFrame:
    """Long ``(item_id, property='zipf', value)`` rows for the ``word`` items that have a Zipf."""
    words = items.filter(pl.col("kind") == "word")
    frames = []
    for (lang,), group in words.group_by(["lang"], maintain_order=True):
        values = zipf_values(group["text"].str.strip_chars().to_list(), lang)
        frames.append(pl.DataFrame({"item_id": group["item_id"], "property": ZIPF,
                                    "value": pl.Series(values, dtype=pl.Float64)}))
    if not frames:
        return pl.DataFrame(schema={"item_id": pl.String, "property": pl.String, "value": pl.Float64})
    return pl.concat(frames).filter(pl.col("value").is_not_null())


def with_zipf(ps: ProbeSet) -> ProbeSet:
    """``ps`` plus a ``zipf`` property for every word item that has none yet (given Zipf values win)."""
    have = ps.properties.filter(pl.col("property") == ZIPF)["item_id"].implode()
    missing = ps.items.filter((pl.col("kind") == "word") & ~pl.col("item_id").is_in(have))
    if missing.height == 0:
        return ps
    props = pl.concat([ps.properties, zipf_properties(missing)])
    return ProbeSet(name=ps.name, items=ps.items, properties=props, relations=ps.relations,
                    origin=ps.origin, template=ps.template, first_row=ps.first_row)


def whole_word(token: str, scheme: str) -> str | None:
    """The word a vocabulary token stands for when it is a whole (or word-initial) word, else ``None``.

    ``scheme`` is ``"wordpiece"`` (a token not starting with ``##``), or ``"sentencepiece"`` /
    ``"bytelevel"`` (a token starting with ``▁`` / ``Ġ``, marker removed). The rest must be letters
    only, which also leaves out special tokens (``[CLS]``, ``<s>``, ``[unused0]``), digits and punctuation.
    For the marker schemes a word-initial piece (``▁un`` of "unbelievable") cannot be told from a whole
    word; Zipf then measures the string, which is what such a token mostly is in text.
    """
    if scheme == "wordpiece":
        word = None if token.startswith(_WORDPIECE_CONTINUATION) else token
    else:
        marker = "▁" if scheme == "sentencepiece" else "Ġ"
        word = token[len(marker):] if token.startswith(marker) else None
    return word if word and word.isalpha() else None


def vocabulary_scheme(tokens: Sequence[str]) -> str:
    """Guess how a vocabulary marks word boundaries: ``wordpiece``, ``sentencepiece`` or ``bytelevel``."""
    counts = {m: sum(1 for t in tokens if t.startswith(m)) for m in _WORD_START_MARKERS}
    marker, n = max(counts.items(), key=lambda kv: kv[1])
    if n >= 0.1 * max(1, len(tokens)):
        return "sentencepiece" if marker == "▁" else "bytelevel"
    return "wordpiece"


def token_zipf(token_ids: Sequence[int], tokens: Sequence[str], lang: str = "en") -> pl.DataFrame:
    """Zipf of each whole-word token of a vocabulary: ``(token_id, property='zipf', value)``.

    Args:
        token_ids: ids of the vocabulary rows, aligned with ``tokens``.
        tokens: the token strings (``""`` where the tokenizer has none).
        lang: wordfreq language.

    Returns:
        One row per whole-word token wordfreq knows (Zipf > 0); sub-word pieces (``##ing``), special
        tokens and unknown words have no row. Case is folded by wordfreq, so ``Dog`` and ``dog`` share
        a value.
    """
    scheme = vocabulary_scheme(tokens)
    ids, words = [], []
    for i, t in zip(token_ids, tokens, strict=True):
        w = whole_word(t, scheme)
        if w is not None:
            ids.append(int(i))
            words.append(w)
    values = zipf_values(words, lang)
    frame = pl.DataFrame({"token_id": pl.Series(ids, dtype=pl.Int64), "property": ZIPF,
                          "value": pl.Series(values, dtype=pl.Float64)})
    return frame.filter(pl.col("value").is_not_null())


def token_properties(
    model: str, release: str, token_ids: Sequence[int], tokens: Sequence[str]
) -> pl.DataFrame:
    """Rows of the ``token_properties`` table: ``model, release, token_id, property, value``."""
    z = token_zipf(token_ids, tokens)
    return z.select(
        pl.lit(model).alias("model"), pl.lit(release).alias("release"), "token_id", "property", "value"
    )
