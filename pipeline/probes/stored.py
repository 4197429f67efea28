"""Probe sets kept under the storage root, data sets the project reads but does not ship, and the listing.

* **Stored** sets live at ``<root>/probes/probe_set=<name>/{items,properties,relations}.parquet``:
  every audited set is written there, and ``normaudit probes add`` registers the user's own data there,
  so ``normaudit audit --probes <name>`` finds it later.
* **External** sets (:data:`EXTERNAL`) have a built-in name and reader but data whose licence forbids
  shipping it (or states none): they are read from the user's copy — a stored one if ``probes add``
  registered it, else the conventional ``../shared/data`` folder beside the checkout.
* **Formats** (:data:`FORMATS`) name the reader for ``probes add --format``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict

from pipeline.probes.annotations import read_label_distributions
from pipeline.probes.base import ITEM_SCHEMA, PROPERTY_SCHEMA, RELATION_SCHEMA, ProbeInputError, ProbeSet, text_sha256
from pipeline.probes.builtin import BUILTIN
from pipeline.probes.files import read_probe_file
from pipeline.probes.ratings import read_rating_norms
from pipeline.probes.retrieval import read_beir
from pipeline.probes.templates import split_template
from pipeline.storage.store import Store

TABLES = {"items": ITEM_SCHEMA, "properties": PROPERTY_SCHEMA, "relations": RELATION_SCHEMA}


def _read_table_file(url, name, storage_options=None, **opts):
    return read_probe_file(url, name, storage_options, **opts)


def _read_rating_norms(url, name, storage_options=None, **opts):
    return read_rating_norms(url, name, storage_options, **opts)


def _read_label_counts(url, name, storage_options=None, **opts):
    return read_label_distributions(url, name, storage_options, **opts)


def _read_beir(url, name, storage_options=None, **opts):
    return read_beir(url, name, storage_options=storage_options, **opts)


# format -> (reader, options it accepts); the reader takes (url, name, storage_options, **options)
FORMATS: dict[str, tuple[Callable[..., ProbeSet], frozenset[str]]] = {
    "table": (_read_table_file, frozenset({"id_col", "text_col", "properties", "kind", "lang"})),
    "rating-norms": (_read_rating_norms, frozenset({"lang"})),
    "label-counts": (_read_label_counts, frozenset({"lang"})),
    "beir": (_read_beir, frozenset({"split"})),
}


class ExternalSet(BaseModel):
    """A probe set with a built-in reader whose data the user supplies (not redistributable here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    format: str
    shared_path: str  # relative to ../shared/data
    terms: str
    origin: str


EXTERNAL: dict[str, ExternalSet] = {s.name: s for s in (
    ExternalSet(name="brysbaert-concreteness", format="rating-norms",
                shared_path="brysbaert_concreteness/brysbaert2014_concreteness.csv",
                terms="CC BY-NC-ND 3.0 (as listed); not redistributed",
                origin="Brysbaert, Warriner & Kuperman (2014), crr.ugent.be/archives/1330"),
    ExternalSet(name="chaosnli-snli", format="label-counts", shared_path="chaosnli/chaosNLI_snli.jsonl",
                terms="CC BY-NC 4.0; never copied into the project",
                origin="ChaosNLI v1.0 (Nie, Zhou & Bansal 2020), github.com/easonnie/ChaosNLI"),
    ExternalSet(name="chaosnli-mnli", format="label-counts", shared_path="chaosnli/chaosNLI_mnli_m.jsonl",
                terms="CC BY-NC 4.0; never copied into the project",
                origin="ChaosNLI v1.0 (Nie, Zhou & Bansal 2020), github.com/easonnie/ChaosNLI"),
    ExternalSet(name="cranfield", format="beir", shared_path="cranfield",
                terms="no licence stated (research use, cite Cleverdon 1967); not redistributed",
                origin="Cranfield II collection, Glasgow IR group test collections"),
)}


def shared_data_dirs() -> list[Path]:
    """Where ``../shared/data`` may be: beside the working directory, or beside this checkout."""
    here = Path(__file__).resolve()
    candidates = [Path.cwd().parent / "shared" / "data"]
    if len(here.parents) > 3:
        candidates.append(here.parents[3] / "shared" / "data")
    return list(dict.fromkeys(c.resolve() for c in candidates))


def external_path(spec: ExternalSet) -> Path | None:
    """The user's copy of an external set in ``../shared/data``, or ``None``."""
    for d in shared_data_dirs():
        if (d / spec.shared_path).exists():
            return d / spec.shared_path
    return None


def read_source(fmt: str, url: str, name: str, storage_options: dict | None = None, **options) -> ProbeSet:
    """Read ``url`` with the reader of format ``fmt``; options it does not take are an error."""
    if fmt not in FORMATS:
        raise ProbeInputError(f"unknown probe format {fmt!r}; use one of {sorted(FORMATS)}.")
    reader, accepted = FORMATS[fmt]
    given = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(given) - accepted)
    if extra:
        raise ProbeInputError(
            f"format {fmt!r} takes no option {extra}; it takes {sorted(accepted) or 'none'}."
        )
    return reader(url, name, storage_options, **given)


def load_external(spec: ExternalSet, store: Store | None) -> ProbeSet:
    """An external set: the stored copy if there is one, else the user's copy in ``../shared/data``."""
    if store is not None:
        stored = read_stored(store, spec.name)
        if stored is not None:
            return stored
    path = external_path(spec)
    if path is None:
        raise ProbeInputError(
            f"probe set {spec.name!r} is not shipped with normaudit ({spec.terms}): get it from "
            f"{spec.origin}, then register your copy with "
            f"`normaudit probes add {spec.name} --from PATH --format {spec.format}` "
            f"(or place it at ../shared/data/{spec.shared_path})."
        )
    return read_source(spec.format, str(path), spec.name)


def stored_names(store: Store) -> list[str]:
    """Names of the probe sets stored under the root."""
    found = store.glob("probes/probe_set=*/items.parquet")
    return sorted(p.split("/")[1].removeprefix("probe_set=") for p in found)


def read_stored(store: Store, name: str) -> ProbeSet | None:
    """The probe set stored under the root as ``name``, or ``None``."""
    d = store.probes_dir(name)
    if not store.exists(f"{d}/items.parquet"):
        return None
    frames = {}
    for table, schema in TABLES.items():
        rel = f"{d}/{table}.parquet"
        frames[table] = (pl.from_arrow(store.read_table(rel, columns=list(schema))) if store.exists(rel)
                         else pl.DataFrame(schema=schema))
    return ProbeSet(name=name, items=frames["items"], properties=frames["properties"],
                    relations=frames["relations"], origin=store.url(d))


def _same(a: ProbeSet, b: ProbeSet) -> bool:
    return all(getattr(a, t).equals(getattr(b, t)) for t in TABLES)


def _differences(old: ProbeSet, new: ProbeSet) -> tuple[int, int, int]:
    """Texts changed, items added and items removed from ``old`` to ``new``."""
    a, b = old.items.select("item_id", "text"), new.items.select("item_id", "text")
    both = a.join(b, on="item_id", suffix="_new")
    return (both.filter(both["text"] != both["text_new"]).height, b.join(a, on="item_id", how="anti").height,
            a.join(b, on="item_id", how="anti").height)


def refuse_silent_replace(store: Store, ps: ProbeSet, source: str, replace: bool, command: str = "audit") -> None:
    """Raise :class:`ProbeInputError` when storing ``ps`` would change a stored set of its name, unless ``replace``.

    ``source`` is what brought the data (a file path or URL); ``command`` the one the user ran, for the hint.
    Two files with the same stem name the same set, so the second is refused like an edited first.
    """
    old = read_stored(store, ps.name)
    if old is None or replace or _same(old, ps):
        return
    templated = split_template(source) if command == "audit" else None  # FILE@template
    file, base = (templated[0], ps.name.rpartition("@")[0]) if templated else (source, ps.name)
    raise replace_refusal(ps.name, old.origin, source, *_differences(old, ps), command, file, base)


def replace_refusal(name: str, stored_at: str, source: str, texts: int, added: int, removed: int,
                    command: str = "audit", file: str | None = None, base: str | None = None) -> ProbeInputError:
    """The error refusing to store ``source`` over the different stored set ``name`` (``texts`` changed, ``added``
    and ``removed`` items; all zero: other properties, relations, kinds or order); ``file``/``base``: the file and
    the set's name without its template, when ``source`` is ``FILE@template``."""
    file, base = file or source, base or name
    how = (f"rerun `normaudit audit ... --probes {source} --replace`, or store it by name with "
           f"`normaudit probes add {base} --from {file} --replace` and audit `--probes {name}`"
           if command == "audit" else f"rerun `normaudit probes add {name} --from {source} --replace`")
    parts = [(texts, "text{} changed"), (added, "item{} added"), (removed, "item{} removed")]
    said = ", ".join(f"{n} {what.format('' if n == 1 else 's')}" for n, what in parts if n)
    return ProbeInputError(
        f"probe set {name!r} is already stored at {stored_at} with other data than {source} "
        f"({said or 'other properties, relations, kinds or order'}); nothing was written. To replace it, {how}: "
        "the next audit of each release then re-embeds the changed texts, and until then their old vectors are "
        "hidden from the views. To keep both, give the file another name (a probe file's set is named after its "
        "file name)."
    )


def add_probe_set(
    store: Store, name: str, url: str, fmt: str | None = None, storage_options: dict | None = None,
    replace: bool = False, **options,
) -> ProbeSet:
    """Read, validate and store the user's data as probe set ``name`` (nothing is written on an error).

    ``fmt`` defaults to the external set's format for an external name, else ``table``. Re-adding the
    same data is a no-op; different data under a stored name needs ``replace=True``. A replaced text keeps
    its item id but gets a new text hash: the next audit of a release re-embeds it (:mod:`pipeline.storage.shards`).
    """
    if name in BUILTIN:
        raise ProbeInputError(f"{name!r} is a built-in probe set; choose another name.")
    if split_template(name) is not None:
        raise ProbeInputError(f"{name!r} ends in a template name (@...); choose another name.")
    fmt = fmt or (EXTERNAL[name].format if name in EXTERNAL else "table")
    ps = read_source(fmt, url, name, storage_options, **options)
    refuse_silent_replace(store, ps, url, replace, command="probes add")
    write_probe_tables(store, ps)
    return ps


def summarize(ps: ProbeSet, status: str) -> dict:
    """One ``list_probe_sets`` row: counts per kind and per relation, and the property names."""
    kinds = ps.items.group_by("kind").len().sort("kind")
    rels = ps.relations.group_by("relation").len().sort("relation")
    return {
        "probe_set": ps.name, "status": status, "items": ps.items.height,
        "kinds": ", ".join(f"{k} {n}" for k, n in kinds.iter_rows()),
        "properties": ", ".join(sorted(set(ps.properties["property"].to_list()))),
        "relations": ", ".join(f"{r} {n}" for r, n in rels.iter_rows()),
    }


def list_probe_sets(store: Store) -> pl.DataFrame:
    """Every probe set: built-in, external (stored or found in ``../shared/data``) and stored under the root.

    Columns: ``probe_set``, ``status``, ``items``, ``kinds``, ``properties``, ``relations`` (counts per kind
    and per relation).
    """
    stored = set(stored_names(store))
    rows = [summarize(load(), "built-in" + (", stored" if name in stored else ""))
            for name, load in BUILTIN.items()]
    for name, spec in EXTERNAL.items():
        if name in stored:
            rows.append(summarize(read_stored(store, name), "external, stored"))
        elif (path := external_path(spec)) is not None:
            rows.append(summarize(load_external(spec, None), f"external, not stored (read from {path})"))
        else:
            rows.append({"probe_set": name, "status": f"external, not available ({spec.terms})",
                         "items": None, "kinds": "", "properties": "", "relations": ""})
    for name in sorted(stored - set(BUILTIN) - set(EXTERNAL)):
        rows.append(summarize(read_stored(store, name), "stored"))
    return pl.DataFrame(rows, schema={"probe_set": pl.String, "status": pl.String, "items": pl.Int64,
                                      "kinds": pl.String, "properties": pl.String, "relations": pl.String})


ITEM_ROW_GROUP = 8192  # a shard (4,096 x 2^k items, aligned) spans whole groups of this size or sits in one


def write_probe_tables(store: Store, ps: ProbeSet) -> None:
    """Write the probe set's items, properties and relations; unchanged tables are left alone.

    Items get ``text_sha256`` (of each text's UTF-8 bytes), the hash every embedding row of the item
    must carry (see :mod:`pipeline.storage.shards`), so the invariant can be checked in SQL.
    """
    d = store.probes_dir(ps.name)
    items = ps.items.with_columns(pl.Series("text_sha256", text_sha256(ps.items["text"].to_list()), pl.String))
    for table, frame in (("items", items), ("properties", ps.properties), ("relations", ps.relations)):
        arrow = frame.with_columns(pl.lit(ps.name).alias("probe_set")).select(
            ["probe_set", *frame.columns]
        ).to_arrow()
        rel = f"{d}/{table}.parquet"
        if store.exists(rel) and store.read_table(rel).equals(arrow):
            continue
        # items in groups of ITEM_ROW_GROUP rows: each worker reads only its shard's groups (storage.shards.read_shard)
        store.write_table(rel, arrow, row_group_size=ITEM_ROW_GROUP if table == "items" else None)
