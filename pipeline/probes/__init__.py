"""Probe-set registry: built-in, external and stored sets by name, templates, or a probe file by path/URL."""

from __future__ import annotations

import difflib
import posixpath
import re

from pipeline.names import check_name
from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.probes.builtin import BUILTIN
from pipeline.probes.files import read_probe_file
from pipeline.probes.stored import EXTERNAL, load_external, read_stored, stored_names, write_probe_tables
from pipeline.probes.templates import TEMPLATES, apply_template, split_template
from pipeline.storage.store import Store

FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".parquet")


def load_probe_set(spec: str, storage_options: dict | None = None, store: Store | None = None) -> ProbeSet:
    """Resolve ``spec`` to a validated probe set.

    In order: a built-in name (:data:`BUILTIN`); a probe file (CSV/TSV/JSONL/Parquet path or URL, named
    after its stem); ``<spec>@<template>`` (the word items of ``<spec>`` inside a sentence template, see
    :mod:`pipeline.probes.templates`); an external set (:data:`pipeline.probes.stored.EXTERNAL`); a set
    stored under ``store``'s root (``normaudit probes add``). A miss suggests the closest names.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec.lower().endswith(FILE_SUFFIXES):
        return read_probe_file(spec, file_set_name(spec), storage_options)
    templated = split_template(spec)
    if templated is not None:
        return apply_template(load_probe_set(templated[0], storage_options, store), templated[1])
    if spec in EXTERNAL:
        return load_external(EXTERNAL[spec], store)
    stored = read_stored(store, spec) if store is not None and _is_name(spec) else None
    if stored is not None:
        return stored
    known = [*BUILTIN, *EXTERNAL, *(stored_names(store) if store is not None else [])]
    close = difflib.get_close_matches(spec, known, n=3)
    hint = f" Did you mean {close}?" if close else ""
    raise ProbeInputError(
        f"unknown probe set {spec!r}.{hint} Built-in: {sorted(BUILTIN)}; external: {sorted(EXTERNAL)}; "
        f"stored: `normaudit probes list`; templates: NAME@{{{','.join(TEMPLATES)}}}; or pass a "
        ".csv/.jsonl/.parquet file with columns item_id and text."
    )


def file_set_name(spec: str) -> str:
    """The name of the probe set a probe file brings: its file name's stem, made a valid name."""
    stem = posixpath.splitext(posixpath.basename(spec))[0]
    return re.sub(r"[^A-Za-z0-9._+@-]", "-", stem).strip("-.") or "probes"


def _is_name(spec: str) -> bool:
    try:
        check_name(spec)
    except ValueError:
        return False
    return True


def brings_file(spec: str) -> bool:
    """True when ``spec`` reads a probe file (a path or URL, bare or inside a template), not a set by name.

    Storing such a set must not replace a stored set of the same name unless the user asks
    (:func:`pipeline.probes.stored.refuse_silent_replace`): two files share a name when they share a stem.
    """
    templated = split_template(spec)
    return (templated[0] if templated else spec).lower().endswith(FILE_SUFFIXES)


__all__ = ["BUILTIN", "ProbeInputError", "ProbeSet", "brings_file", "file_set_name", "load_probe_set",
           "write_probe_tables"]
