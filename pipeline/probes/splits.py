"""A seeded train/test split of the reverse dictionary's queries, for fine-tuning without leaking the test.

``normaudit theory finetune`` trains on definition -> lemma pairs of the **train** split; the built-in
probe set ``wordnet-reverse-dictionary-test`` holds the **test** split's definitions as queries against
every lemma as a document, so retrieval after fine-tuning is measured on definitions (and answers) that
training never saw. The split is a pure function of the lemma and the seed (sha256), so it does not move
when the WordNet table gains or loses other rows, and every machine draws the same one.
"""

from __future__ import annotations

import hashlib

import polars as pl

from pipeline.probes.base import ProbeSet
from pipeline.probes.retrieval import REVERSE_DICTIONARY, load_reverse_dictionary

SPLIT_SEED = 0
TEST_FRACTION = 0.1
REVERSE_DICTIONARY_TEST = f"{REVERSE_DICTIONARY}-test"


def in_test_split(lemma: str, seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION) -> bool:
    """Whether ``lemma``'s definition belongs to the test split (sha256 of ``seed:lemma``, uniform in [0, 1))."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), not {test_fraction}")
    digest = hashlib.sha256(f"{seed}:{lemma}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction


def reverse_dictionary_pairs(split: str, seed: int = SPLIT_SEED,
                             test_fraction: float = TEST_FRACTION) -> pl.DataFrame:
    """``(lemma, definition, word)`` of one split (``"train"`` or ``"test"``), in the probe set's order."""
    return _split_pairs(load_reverse_dictionary(), split, seed, test_fraction)


def _split_pairs(ps: ProbeSet, split: str, seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION):
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    texts = dict(zip(ps.items["item_id"], ps.items["text"], strict=True))
    lemmas = [i[2:] for i in ps.items.filter(pl.col("kind") == "query")["item_id"]]
    keep = [w for w in lemmas if in_test_split(w, seed, test_fraction) == (split == "test")]
    return pl.DataFrame({"lemma": keep, "definition": [texts[f"q:{w}"] for w in keep],
                         "word": [texts[f"d:{w}"] for w in keep]})


def load_reverse_dictionary_test() -> ProbeSet:
    """``wordnet-reverse-dictionary-test``: the test split's definitions as queries, every lemma as a document.

    The documents are all of ``wordnet-reverse-dictionary``'s (train lemmas are the distractors a
    fine-tuned model has seen); queries and relevance are the test split's only.
    """
    ps = load_reverse_dictionary()
    lemmas = _split_pairs(ps, "test")["lemma"]
    queries, answers = ("q:" + lemmas).to_list(), ("d:" + lemmas).to_list()
    kept = ps.items.filter((pl.col("kind") == "doc") | pl.col("item_id").is_in(queries))
    # the retrieval order: each query, then its answer; the remaining documents last (``--limit`` keeps pairs)
    paired = pl.col("item_id").is_in(queries + answers)
    return ProbeSet(name=REVERSE_DICTIONARY_TEST, items=pl.concat([kept.filter(paired), kept.filter(~paired)]),
                    properties=ps.properties, relations=ps.relations.filter(pl.col("left_id").is_in(queries)),
                    origin=ps.origin)
