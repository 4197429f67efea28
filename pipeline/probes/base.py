"""Probe sets as validated frames, and the checks every probe source goes through.

A probe set is three long-format tables (docs/design.md): ``items`` (item_id, text,
kind, lang, source), ``properties`` (item_id, property, value) and ``relations``
(left_id, right_id, relation, value). The ``probe_set`` column is added when the
tables are written, so builders never repeat the name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

from pipeline.names import check_name
from pipeline.quality.suites import MAX_TEXT_CHARS  # the probe_items suite's limit, enforced here before any write

ITEM_SCHEMA = {
    "item_id": pl.String, "text": pl.String, "kind": pl.String, "lang": pl.String, "source": pl.String,
}
PROPERTY_SCHEMA = {"item_id": pl.String, "property": pl.String, "value": pl.Float64}
RELATION_SCHEMA = {"left_id": pl.String, "right_id": pl.String, "relation": pl.String, "value": pl.Float64}
KINDS = frozenset({"word", "sentence", "query", "doc", "pair"})


def infer_kind(texts: Iterable[str | None]) -> str:
    """``word`` when every text is one whitespace-free token (surrounding spaces aside), else ``sentence``.

    The kind decides whether items get a wordfreq ``zipf`` and so every frequency-controlled statistic,
    which is why callers say which kind they inferred.
    """
    return "word" if all(t is not None and len(t.split()) == 1 for t in texts) else "sentence"


def text_sha256(texts: Iterable[str]) -> list[str]:
    """Hex sha256 of each text's exact UTF-8 bytes: an item's identity for embedding, beside its id.

    The text is the one embedded (after any template), so a changed text under an unchanged id gets
    a new hash, a new shard and a new vector (:mod:`pipeline.storage.shards`); DuckDB's ``sha256(text)`` is the same.
    """
    return [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]


class ProbeInputError(ValueError):
    """Bad probe input: the message names the source, the row or column, and what to do."""


def empty_frame(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


@dataclass
class ProbeSet:
    """One probe set: items to embed plus their measured properties and relations."""

    name: str
    items: pl.DataFrame
    properties: pl.DataFrame = field(default_factory=lambda: empty_frame(PROPERTY_SCHEMA))
    relations: pl.DataFrame = field(default_factory=lambda: empty_frame(RELATION_SCHEMA))
    origin: str = ""
    # the text template the items were embedded in (e.g. "This is a {}."), None for bare items; it changes
    # the embedded text but not the item ids, so it is part of the shard hash (see shard_params)
    template: str | None = None
    # what a reader chose for the user (an inferred kind, ...): the CLI prints these; not part of the data
    notes: list[str] = field(default_factory=list, compare=False)
    # rows of the file before these items: a block of a file read in blocks reports the file's row numbers
    first_row: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name, what="probe set name")
        self.items = self.items.select([pl.col(c).cast(t) for c, t in ITEM_SCHEMA.items()])
        self.properties = self.properties.select([pl.col(c).cast(t) for c, t in PROPERTY_SCHEMA.items()])
        self.relations = self.relations.select([pl.col(c).cast(t) for c, t in RELATION_SCHEMA.items()])
        validate_probe_set(self)

    def head(self, n: int | None) -> ProbeSet:
        """The first ``n`` items in the set's stable order, with their properties and relations."""
        if n is None or n >= self.items.height:
            return self
        items = self.items.head(n)
        ids = items["item_id"]
        return ProbeSet(
            name=self.name,
            items=items,
            properties=self.properties.filter(pl.col("item_id").is_in(ids.implode())),
            relations=self.relations.filter(
                pl.col("left_id").is_in(ids.implode()) & pl.col("right_id").is_in(ids.implode())
            ),
            origin=self.origin,
            template=self.template,
        )

    def shard_params(self) -> dict:
        """What, besides item ids and the model, decides the embedded text: it goes into the shard hash."""
        return {"template": self.template} if self.template else {}


def _rows(mask: pl.Series, limit: int = 5, first_row: int = 0) -> str:
    # 1-based data-row numbers, the way a person counts rows in a file without its header
    idx = [first_row + i + 1 for i in mask.arg_true().to_list()[:limit]]
    more = "" if mask.sum() <= limit else f" (and {mask.sum() - limit} more)"
    return ", ".join(map(str, idx)) + more


def validate_probe_set(ps: ProbeSet) -> None:
    """Raise :class:`ProbeInputError` unless every item is usable; nothing is written before this passes."""
    where = ps.origin or ps.name
    items = ps.items
    at = ps.first_row  # the rows of the file before these items (a block of a file read in blocks)
    if items.height == 0:
        raise ProbeInputError(f"{where}: probe set {ps.name!r} has no items; give at least one row.")
    null_id = items["item_id"].is_null() | (items["item_id"].str.strip_chars() == "")
    if null_id.any():
        raise ProbeInputError(
            f"{where}: empty item_id in row {_rows(null_id, first_row=at)}; every item needs an id.")
    dup = items["item_id"].is_duplicated()
    if dup.any():
        first = items.filter(dup)["item_id"].unique(maintain_order=True).head(3).to_list()
        raise ProbeInputError(
            f"{where}: duplicate item_id {first} in rows {_rows(dup, first_row=at)}; "
            "ids must be unique within a probe set."
        )
    empty = items["text"].is_null() | (items["text"].str.strip_chars() == "")
    if empty.any():
        raise ProbeInputError(
            f"{where}: empty text in row {_rows(empty, first_row=at)} (item_id "
            f"{items.filter(empty)['item_id'].head(3).to_list()}); remove the row or give it text."
        )
    long = items["text"].str.len_chars() > MAX_TEXT_CHARS
    if long.any():
        first = items.filter(long).row(0, named=True)
        raise ProbeInputError(
            f"{where}: column 'text' in row {_rows(long, first_row=at)} "
            f"(item_id {items.filter(long)['item_id'].head(3).to_list()}) "
            f"holds {len(first['text']):,} characters, over the limit of {MAX_TEXT_CHARS:,}; shorten or split it."
        )
    bad_kind = ~items["kind"].is_in(list(KINDS))
    if bad_kind.any():
        raise ProbeInputError(
            f"{where}: unknown kind in row {_rows(bad_kind, first_row=at)}; use one of {sorted(KINDS)}."
        )
    props = ps.properties
    if props.height:
        unknown = ~props["item_id"].is_in(items["item_id"].implode())
        if unknown.any():
            raise ProbeInputError(
                f"{where}: properties name item_id {props.filter(unknown)['item_id'].head(3).to_list()} "
                "that is not among the items."
            )
        dup_p = props.select(["item_id", "property"]).is_duplicated()
        if dup_p.any():
            raise ProbeInputError(
                f"{where}: a property is given twice for the same item (rows {_rows(dup_p)})."
            )
        bad = props["value"].is_null() | ~props["value"].is_finite()
        if bad.any():
            raise ProbeInputError(
                f"{where}: property value is missing or not finite for "
                f"{props.filter(bad).select(['item_id', 'property']).head(3).rows()}; "
                "drop those rows or fix them."
            )
    _validate_relations(ps, where)


def _validate_relations(ps: ProbeSet, where: str) -> None:
    rel = ps.relations
    if rel.height == 0:
        return
    ids = ps.items["item_id"].implode()
    for side in ("left_id", "right_id"):
        unknown = rel[side].is_null() | ~rel[side].is_in(ids)
        if unknown.any():
            raise ProbeInputError(
                f"{where}: relation {side} {rel.filter(unknown)[side].head(3).to_list()} (relation row "
                f"{_rows(unknown)}) is not among the items; a relation must join two items of the set."
            )
    no_name = rel["relation"].is_null() | (rel["relation"].str.strip_chars() == "")
    if no_name.any():
        raise ProbeInputError(f"{where}: relation row {_rows(no_name)} has no relation name.")
    dup = rel.select(["left_id", "right_id", "relation"]).is_duplicated()
    if dup.any():
        raise ProbeInputError(
            f"{where}: relation given twice: "
            f"{rel.filter(dup).select(['left_id', 'right_id', 'relation']).head(3).rows()} "
            f"(relation rows {_rows(dup)})."
        )
    bad = rel["value"].is_not_null() & ~rel["value"].is_finite()
    if bad.any():
        raise ProbeInputError(f"{where}: relation value is not finite in relation row {_rows(bad)}.")
