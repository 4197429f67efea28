"""Probe sets from the user's own files: CSV, JSONL or Parquet, local or any fsspec URL.

Required columns: ``item_id`` and ``text``. Optional: ``kind``, ``lang``, ``source``.
Every other numeric column becomes a property (long format). Errors name the file
and the line or column, and nothing is written until the whole file is valid.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath

import fsspec
import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet

REQUIRED = ("item_id", "text")
ITEM_COLUMNS = ("item_id", "text", "kind", "lang", "source")


def _decode(data: bytes, url: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ProbeInputError(
            f"{url}: invalid UTF-8 at line {line} (byte {exc.start}); re-save the file as UTF-8."
        ) from exc


def _read_csv(text: str, url: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    for row in reader:
        if None in row:
            raise ProbeInputError(f"{url}: line {reader.line_num} has more fields than the header.")
        rows.append(row)
    return rows


def _read_jsonl(text: str, url: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProbeInputError(f"{url}: line {n} is not valid JSON ({exc.msg}); fix or remove that line.") from exc
        if not isinstance(obj, dict):
            raise ProbeInputError(f"{url}: line {n} is not a JSON object.")
        rows.append(obj)
    return rows


def _frame(url: str, storage_options: dict | None) -> pl.DataFrame:
    fmt = posixpath.splitext(url.split("?")[0])[1].lower()
    with fsspec.open(url, "rb", **(storage_options or {})) as fh:
        data = fh.read()
    if fmt == ".parquet":
        return pl.read_parquet(io.BytesIO(data))
    text = _decode(data, url)
    if fmt == ".csv":
        rows = _read_csv(text, url)
    elif fmt in (".jsonl", ".ndjson"):
        rows = _read_jsonl(text, url)
    else:
        raise ProbeInputError(f"{url}: unknown probe file type {fmt!r}; use .csv, .jsonl or .parquet.")
    if not rows:
        raise ProbeInputError(f"{url}: no rows.")
    return pl.DataFrame(rows, infer_schema_length=None) if fmt != ".csv" else pl.DataFrame(rows)


def read_probe_file(url: str, name: str, storage_options: dict | None = None) -> ProbeSet:
    """Read a probe file into a validated :class:`ProbeSet` named ``name``."""
    df = _frame(url, storage_options)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ProbeInputError(
            f"{url}: missing column {missing[0]!r} (columns present: {df.columns}); "
            "a probe file needs 'item_id' and 'text'."
        )
    df = df.with_columns(pl.col("item_id").cast(pl.String), pl.col("text").cast(pl.String))
    items = df.select(
        pl.col("item_id"),
        pl.col("text"),
        (pl.col("kind").cast(pl.String) if "kind" in df.columns else pl.lit("sentence")).alias("kind"),
        (pl.col("lang").cast(pl.String) if "lang" in df.columns else pl.lit("und")).alias("lang"),
        (pl.col("source").cast(pl.String) if "source" in df.columns else pl.lit(url)).alias("source"),
    )
    props = []
    for col in df.columns:
        if col in ITEM_COLUMNS:
            continue
        try:
            values = df[col].cast(pl.Float64, strict=True)
        except pl.exceptions.InvalidOperationError as exc:
            raise ProbeInputError(
                f"{url}: column {col!r} is not numeric ({exc.__class__.__name__}); properties must be numbers. "
                "Drop the column or fix its values."
            ) from exc
        props.append(
            pl.DataFrame({"item_id": df["item_id"], "property": col, "value": values}).filter(
                pl.col("value").is_not_null()
            )
        )
    properties = pl.concat(props) if props else None
    kwargs = {"properties": properties} if properties is not None else {}
    return ProbeSet(name=name, items=items, origin=url, **kwargs)
