"""The ``wordnet-pairs`` probe set: direct hypernym/hyponym pairs of common single-word nouns.

A pair (``animal``, ``dog``) is kept when the *first* noun sense of ``animal`` is a direct hypernym
(``@`` pointer) of the first noun sense of ``dog`` and both lemmas are in ``wordnet-nouns`` (common,
single-word, mostly-noun lemmas; see :func:`pipeline.probes.wordnet.build_wordnet_nouns`).

Why first senses only: Zipf measures a word *string*, and a word's first WordNet sense is its most
frequent one, so the pair compares what the two words usually mean. Pairing all senses would add
(``food``, ``dog``) through the hot-dog sense and (``module``, ``will``)-like pairs through rare senses,
and frequency matching would then match the wrong meanings.

Stored: ``probe_relations`` rows ``(left_id = hypernym item id, right_id = hyponym item id,
relation = 'hypernym_of', value = 1.0)`` (value: hypernym steps, always 1 for direct pairs); every
lemma of a pair is one ``word`` item (item id = WordNet lemma, as in ``wordnet-nouns``) with all of
``wordnet-nouns``' properties, ``zipf`` included, so analyses can match pairs on frequency.

Only the pair list is shipped (``pipeline/data/wordnet_pairs.parquet``, two string columns); items and
properties are joined from the shipped ``wordnet-nouns`` table when loading, so the two never disagree.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import polars as pl

from pipeline.probes.base import ProbeSet
from pipeline.probes.wordnet import load_wordnet_nouns, parse_data_noun, require_file

PROBE_SET_NAME = "wordnet-pairs"
RELATION = "hypernym_of"
DATA_FILE = "wordnet_pairs.parquet"
SOURCE = "wordnet-3.0"


def build_wordnet_pairs(db_dir: str | Path, nouns_path: str | Path, out_path: str | Path) -> Path:
    """Write the shipped pair list from a WordNet 3.0 folder and the built ``wordnet-nouns`` table.

    Args:
        db_dir: WordNet database folder (reads ``data.noun``).
        nouns_path: the ``wordnet_nouns.parquet`` written by ``build_wordnet_nouns``.
        out_path: where to write ``(hypernym, hyponym)`` rows, ordered for ``--limit`` (see :func:`_order`).

    Returns:
        ``out_path``.
    """
    synsets = parse_data_noun(require_file(Path(db_dir), "data.noun"))
    nouns = pl.read_parquet(nouns_path, columns=["item_id", "synset_offset", "zipf"])
    by_first_sense: dict[int, list[str]] = {}
    for lemma, offset in zip(nouns["item_id"], nouns["synset_offset"], strict=True):
        by_first_sense.setdefault(offset, []).append(lemma)
    rows = []
    for lemma, offset in zip(nouns["item_id"], nouns["synset_offset"], strict=True):
        # wordnet-nouns holds no lemma whose first sense has an instance hypernym (@i), so every
        # hypernym pointer left here is a plain @ pointer
        for parent in sorted(synsets[offset].hypernyms):
            rows.extend((h, lemma) for h in by_first_sense.get(parent, []))
    pairs = pl.DataFrame(rows, schema={"hypernym": pl.String, "hyponym": pl.String}, orient="row")
    out = _order(pairs, nouns.select("item_id", "zipf"))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out.write_parquet(out_path, compression="zstd", compression_level=19, statistics=False)
    return out_path


def _order(pairs: pl.DataFrame, zipf: pl.DataFrame) -> pl.DataFrame:
    # Most frequent pairs first (by the rarer word's Zipf), so that `--limit N` embeds whole, familiar pairs.
    z = zipf.rename({"item_id": "w", "zipf": "z"})
    return (
        pairs.join(z.rename({"w": "hypernym", "z": "z_hyper"}), on="hypernym")
        .join(z.rename({"w": "hyponym", "z": "z_hypo"}), on="hyponym")
        .with_columns(pl.min_horizontal("z_hyper", "z_hypo").alias("z_min"))
        .sort(["z_min", "hyponym", "hypernym"], descending=[True, False, False])
        .select("hypernym", "hyponym")
    )


def load_wordnet_pairs() -> ProbeSet:
    """The shipped ``wordnet-pairs`` probe set (items in pair order, pairs as ``hypernym_of`` relations)."""
    nouns = load_wordnet_nouns()
    ref = resources.files("pipeline.data") / DATA_FILE
    with resources.as_file(ref) as path:
        pairs = pl.read_parquet(path)
        origin = str(path)
    # items in first-appearance order over the ordered pairs: hyponym, then its hypernym
    order = pairs.select(pl.concat_list("hyponym", "hypernym").alias("w")).explode("w")["w"].unique(
        maintain_order=True
    )
    ids = pl.DataFrame({"item_id": order, "pos": pl.int_range(order.len(), eager=True)})
    items = nouns.items.join(ids, on="item_id").sort("pos").drop("pos")
    properties = nouns.properties.filter(pl.col("item_id").is_in(order.implode()))
    relations = pairs.select(
        pl.col("hypernym").alias("left_id"), pl.col("hyponym").alias("right_id"),
        relation=pl.lit(RELATION), value=pl.lit(1.0),
    )
    return ProbeSet(
        name=PROBE_SET_NAME, items=items, properties=properties, relations=relations, origin=origin
    )
