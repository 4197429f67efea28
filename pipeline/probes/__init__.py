"""Probe-set registry: built-in sets by name, or the user's own file by path/URL."""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Callable

import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.store import Store


def _wordnet_nouns() -> ProbeSet:
    from pipeline.probes.wordnet import load_wordnet_nouns

    return load_wordnet_nouns()


BUILTIN: dict[str, Callable[[], ProbeSet]] = {"wordnet-nouns": _wordnet_nouns}
FILE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet")


def load_probe_set(spec: str, storage_options: dict | None = None) -> ProbeSet:
    """A built-in probe set by name, or a probe file (CSV/JSONL/Parquet path or URL) named after its stem."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec.lower().endswith(FILE_SUFFIXES):
        from pipeline.probes.files import read_probe_file

        stem = posixpath.splitext(posixpath.basename(spec))[0]
        name = re.sub(r"[^A-Za-z0-9._+@-]", "-", stem).strip("-.") or "probes"
        return read_probe_file(spec, name, storage_options)
    close = difflib.get_close_matches(spec, BUILTIN, n=3)
    hint = f" Did you mean {close}?" if close else ""
    raise ProbeInputError(
        f"unknown probe set {spec!r}.{hint} Built-in: {sorted(BUILTIN)}; or pass a .csv/.jsonl/.parquet file "
        "with columns item_id and text."
    )


def write_probe_tables(store: Store, ps: ProbeSet) -> None:
    """Write the probe set's items, properties and relations; unchanged tables are left alone."""
    d = store.probes_dir(ps.name)
    for table, frame in (("items", ps.items), ("properties", ps.properties), ("relations", ps.relations)):
        arrow = frame.with_columns(pl.lit(ps.name).alias("probe_set")).select(
            ["probe_set", *frame.columns]
        ).to_arrow()
        rel = f"{d}/{table}.parquet"
        if store.exists(rel) and store.read_table(rel).equals(arrow):
            continue
        store.write_table(rel, arrow)


__all__ = ["BUILTIN", "ProbeInputError", "ProbeSet", "load_probe_set", "write_probe_tables"]
