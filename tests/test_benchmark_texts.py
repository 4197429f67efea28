"""The pipeline-ceiling benchmark's texts: the same mix at every size, so its ratios between sizes measure size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from ceiling_texts import CHUNK, ceiling_sentences  # noqa: E402

from pipeline.probes.scale import template_sentences  # noqa: E402
from pipeline.probes.templates import TEMPLATES  # noqa: E402


@pytest.fixture(scope="module")
def large():
    return ceiling_sentences(CHUNK + 20_000)


def test_the_first_items_do_not_depend_on_the_size(large):
    small = ceiling_sentences(3_000)
    assert small.equals(large.head(3_000))
    assert large["item_id"].n_unique() == large.height


def test_every_size_has_the_same_mix_of_texts(large):
    lengths = large["text"].str.len_bytes()
    first, second_chunk = lengths.head(CHUNK).mean(), lengths.tail(20_000).mean()
    assert abs(second_chunk / first - 1) < 0.02, (first, second_chunk)
    assert set(large.head(1_000)["item_id"].str.split(":").list.first()) == set(TEMPLATES)


def test_each_text_is_its_template_filled_with_the_two_words_of_its_id(large):
    for item_id, text in large.head(200).select("item_id", "text").iter_rows():
        key, _, rest = item_id.partition(":")
        w1, _, rest = rest.partition("+")
        w2, _, position = rest.rpartition("/")
        assert text == TEMPLATES[key].format(f"{w1} and a {w2}")
    assert large["item_id"][-1].endswith(f"/{large.height - 1}")


def test_the_earlier_set_starts_with_the_probe_file_generator_and_an_unknown_mix_is_refused():
    assert ceiling_sentences(1_000, "singles-then-pairs").equals(template_sentences(1_000))
    with pytest.raises(ValueError, match="unknown text mix 'shuffled'"):
        ceiling_sentences(10, "shuffled")
