"""Word probes inside a sentence template: ``<probe set>@<template>``, e.g. ``wordnet-nouns@this-is-a``.

A templated set is a probe set of its own: its name carries the template (so it is stored, embedded and
analysed apart from the bare set), its items keep the bare set's ids, kinds and properties (so SQL can
join the bare and templated norms of a word by ``item_id``), and the template goes into the shard hash
(:meth:`ProbeSet.shard_params`). Templates are data: add a record to :data:`TEMPLATES`.

The text is filled in literally (``a photo of a apple.``): choosing "a" or "an" would need the word's
pronunciation (an hour, a unicorn), and CLIP's prompt ensembles use the same fixed strings.
"""

from __future__ import annotations

import difflib

import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet

TEMPLATES: dict[str, str] = {
    "this-is-a": "This is a {}.",
    "a-photo-of-a": "a photo of a {}.",
    "a-photo-of-the": "a photo of the {}.",
    "the-word": 'The word "{}".',
}
SEPARATOR = "@"


def split_template(spec: str) -> tuple[str, str] | None:
    """``(base spec, template key)`` when ``spec`` ends in ``@<key>`` with a known key, else ``None``."""
    base, sep, key = spec.rpartition(SEPARATOR)
    if not sep or not base:
        return None
    if key in TEMPLATES:
        return base, key
    close = difflib.get_close_matches(key, TEMPLATES, n=1)
    if close:
        raise ProbeInputError(
            f"unknown template {key!r} in probe set {spec!r}; did you mean {base}@{close[0]}? "
            f"Templates: {sorted(TEMPLATES)}."
        )
    return None


def apply_template(ps: ProbeSet, key: str) -> ProbeSet:
    """The word items of ``ps`` inside template ``key``, as the probe set ``<ps.name>@<key>``.

    Raises :class:`ProbeInputError` when ``ps`` has items that are not words (a sentence or a query
    inside "This is a {}." is not the probe the template is meant for).
    """
    template = TEMPLATES[key]
    not_words = ps.items.filter(pl.col("kind") != "word")
    if not_words.height:
        kinds = sorted(set(not_words["kind"].to_list()))
        raise ProbeInputError(
            f"probe set {ps.name!r} has {not_words.height} items of kind {kinds}; templates apply to word "
            f"probes only. Use {ps.name!r} bare."
        )
    if ps.template is not None:
        raise ProbeInputError(f"probe set {ps.name!r} is already templated; apply one template only.")
    prefix, _, suffix = template.partition("{}")
    items = ps.items.with_columns((pl.lit(prefix) + pl.col("text") + pl.lit(suffix)).alias("text"))
    return ProbeSet(
        name=f"{ps.name}{SEPARATOR}{key}", items=items, properties=ps.properties, relations=ps.relations,
        origin=f"{ps.origin or ps.name} in template {template!r}", template=template, notes=list(ps.notes),
    )
