"""The built-in probe sets, by name: shipped with the package (WordNet) or built from it."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.probes.base import ProbeSet
from pipeline.probes.retrieval import load_reverse_dictionary
from pipeline.probes.splits import REVERSE_DICTIONARY_TEST, load_reverse_dictionary_test
from pipeline.probes.wordnet import load_wordnet_nouns
from pipeline.probes.wordnet_pairs import load_wordnet_pairs

BUILTIN: dict[str, Callable[[], ProbeSet]] = {
    "wordnet-nouns": load_wordnet_nouns,
    "wordnet-pairs": load_wordnet_pairs,
    "wordnet-reverse-dictionary": load_reverse_dictionary,
    REVERSE_DICTIONARY_TEST: load_reverse_dictionary_test,
}
