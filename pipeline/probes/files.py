"""Probe sets from the user's own files: CSV, JSONL or Parquet, local or any fsspec URL (``s3://``).

By default the columns are ``item_id`` and ``text`` (required) and ``kind``, ``lang``, ``source``
(optional); every other column becomes a numeric property (long format). A column mapping
(:func:`read_probe_file`'s ``id_col``, ``text_col``, ``properties``) reads any other layout. Word items
(``kind='word'``) get a wordfreq ``zipf`` unless the file gives one.

Errors name the file and the line (CSV, JSONL), row (Parquet) or column, and nothing is written until
the whole file is valid. The readers here (:func:`read_text`, :func:`csv_records`,
:func:`jsonl_records`) are shared by the other probe families so that they all report errors this way.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import posixpath

import fsspec
import polars as pl

from pipeline.probes.base import KINDS, MAX_TEXT_CHARS, ProbeInputError, ProbeSet, infer_kind
from pipeline.probes.frequency import with_zipf

REQUIRED = ("item_id", "text")
ITEM_COLUMNS = ("item_id", "text", "kind", "lang", "source")
FORMATS = (".csv", ".tsv", ".jsonl", ".ndjson", ".parquet")


def read_bytes(url: str, storage_options: dict | None = None) -> bytes:
    """The bytes of ``url``; a missing file is a :class:`ProbeInputError` naming it."""
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as fh:
            return fh.read()
    except FileNotFoundError as exc:
        raise ProbeInputError(f"{url}: no such file; check the path (or bucket and key for s3://).") from exc


def read_text(url: str, storage_options: dict | None = None) -> str:
    """``url`` decoded as UTF-8 (a BOM is dropped); invalid bytes are reported by line."""
    return decode_utf8(read_bytes(url, storage_options), url)


def decode_utf8(data: bytes, url: str, first_line: int = 1, first_byte: int = 0) -> str:
    """``data`` decoded as UTF-8 (a BOM is dropped); ``data`` starts at line ``first_line``, byte ``first_byte``
    of the file ``url`` (a block of it), which an invalid byte is reported by."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # utf-8-sig counts from after a BOM: the byte and line are the file's, BOM included
        start = exc.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        line = first_line + data[:start].count(b"\n")
        raise ProbeInputError(
            f"{url}: invalid UTF-8 at line {line} (byte {first_byte + start}); re-save the file as UTF-8."
        ) from exc


def allow_fields_up_to(n: int) -> None:
    # csv refuses fields over 131,072 characters with a bare "field larger than field limit"; no field can
    # be longer than the text it is read from, so lifting the limit to that length lets the length check
    # in Columns name the line and column instead. The limit is process-wide: it is only ever raised.
    if csv.field_size_limit() < n:
        csv.field_size_limit(n)


def csv_records(text: str, url: str, delimiter: str = ",", line_offset: int = 0) -> list[tuple[int, dict]]:
    """``(line number, row)`` of each data row of a CSV/TSV text with a header line (``line_offset`` is added
    to every line number: the text is the header and a block of the file's rows)."""
    allow_fields_up_to(len(text) + 1)
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    rows = []
    line = 1
    try:
        if reader.fieldnames is None:  # reading the header now makes line_num count from it
            return rows
        line = reader.line_num + 1 + line_offset
        for row in reader:
            if None in row:
                raise ProbeInputError(f"{url}: line {reader.line_num + line_offset} has more fields than the header.")
            rows.append((line, row))
            line = reader.line_num + 1 + line_offset
    except csv.Error as exc:
        raise ProbeInputError(f"{url}: line {line} is not valid CSV ({exc}); fix the quoting on that line.") from exc
    return rows


def jsonl_records(text: str, url: str, first_line: int = 1) -> list[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line of a JSON-lines text (which starts at ``first_line``)."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProbeInputError(
                f"{url}: line {n} is not valid JSON ({exc.msg}); fix or remove that line."
            ) from exc
        if not isinstance(obj, dict):
            raise ProbeInputError(f"{url}: line {n} is not a JSON object.")
        rows.append((n, obj))
    return rows


class Columns:
    """The columns of a probe file as Python lists, with where each row came from for error messages."""

    def __init__(self, url: str, names: list[str], values: dict[str, list], lines: list[int] | None,
                 first_row: int = 0):
        self.url, self.names, self.values, self.lines = url, names, values, lines
        self.first_row = first_row  # rows of the file before these (a block of a file read in blocks)

    def where(self, i: int) -> str:
        return f"line {self.lines[i]}" if self.lines is not None else f"row {self.first_row + i + 1}"

    def require(self, col: str, role: str = "") -> list:
        if col not in self.values:
            what = f" (the {role} column)" if role else ""
            raise ProbeInputError(f"{self.url}: missing column {col!r}{what}; columns present: {self.names}.")
        return self.values[col]

    def strings(self, col: str, role: str = "", integers: bool = False) -> list[str | None]:
        """Column ``col`` as strings; with ``integers`` whole numbers are allowed too (ids such as 17)."""
        values = self.require(col, role)
        # the common case in C loops (a million values: ~0.05 s instead of ~0.7 s); any other goes value by value
        if set(map(type, values)) <= {str, type(None)} and max(map(len, filter(None, values)), default=0) <= \
                MAX_TEXT_CHARS:
            return list(values)
        out: list[str | None] = []
        for i, v in enumerate(values):
            if isinstance(v, str) and len(v) > MAX_TEXT_CHARS:
                raise ProbeInputError(
                    f"{self.url}: column {col!r} at {self.where(i)} holds {len(v):,} characters, over the "
                    f"limit of {MAX_TEXT_CHARS:,}: almost surely a parsing accident (in a CSV, an unclosed "
                    "quote swallows the lines after it); fix the quoting or shorten that value."
                )
            if v is None or isinstance(v, str):
                out.append(v)
            elif integers and isinstance(v, int) and not isinstance(v, bool):
                out.append(str(v))
            else:
                raise ProbeInputError(
                    f"{self.url}: column {col!r} must hold text but has {type(v).__name__} {v!r} at "
                    f"{self.where(i)}; fix that value."
                )
        return out

    def numbers(self, col: str) -> list[float | None]:
        """Column ``col`` as floats (``None`` where empty); text that is not a number is an error."""
        values = self.require(col)
        if set(map(type, values)) <= {float, type(None)}:  # a float column of a Parquet file: nothing to convert
            return list(values)
        out: list[float | None] = []
        for i, v in enumerate(values):
            if v is None or (isinstance(v, str) and not v.strip()):
                out.append(None)
                continue
            try:
                if isinstance(v, bool):
                    raise TypeError
                out.append(float(v))
            except (TypeError, ValueError):
                raise ProbeInputError(
                    f"{self.url}: column {col!r} is not numeric: {v!r} at {self.where(i)}; properties "
                    "must be numbers. Drop the column or fix its values."
                ) from None
        return out


def read_columns(url: str, storage_options: dict | None = None) -> Columns:
    """Read a CSV, TSV, JSONL or Parquet file into :class:`Columns` (chosen by the file's extension)."""
    fmt = posixpath.splitext(url.split("?")[0])[1].lower()
    if fmt not in FORMATS:
        raise ProbeInputError(f"{url}: unknown probe file type {fmt!r}; use .csv, .tsv, .jsonl or .parquet.")
    if fmt == ".parquet":
        try:
            df = pl.read_parquet(io.BytesIO(read_bytes(url, storage_options)))
        except pl.exceptions.PolarsError as exc:
            raise ProbeInputError(f"{url}: not a readable Parquet file ({exc}).") from exc
        if df.height == 0:
            raise ProbeInputError(f"{url}: no rows.")
        return Columns(url, df.columns, {c: df[c].to_list() for c in df.columns}, None)
    text = read_text(url, storage_options)
    records = jsonl_records(text, url) if fmt in (".jsonl", ".ndjson") else csv_records(
        text, url, "\t" if fmt == ".tsv" else ","
    )
    if not records:
        raise ProbeInputError(f"{url}: no rows.")
    return columns_of(url, records)


def columns_of(url: str, records: list[tuple[int, dict]], first_row: int = 0) -> Columns:
    """:class:`Columns` of ``(line number, row)`` records of ``url`` (every key seen is a column)."""
    names: list[str] = []
    for _, r in records:
        names.extend(k for k in r if k not in names)
    values = {c: [r.get(c) for _, r in records] for c in names}
    return Columns(url, names, values, [n for n, _ in records], first_row)


def _constant_or(cols: Columns, col: str, default: str) -> list[str]:
    if col in cols.values:
        return [default if v is None or v == "" else v for v in cols.strings(col)]
    return [default] * len(next(iter(cols.values.values())))


def _kinds(cols: Columns, texts: list[str | None], kind: str | None) -> tuple[list[str], str | None]:
    """Each item's kind, and a note saying which kind was inferred (``None`` when none was)."""
    if kind is not None:
        if kind not in KINDS:
            raise ProbeInputError(f"kind {kind!r} is not one of {sorted(KINDS)}.")
        return [kind] * len(texts), None
    given = cols.strings("kind") if "kind" in cols.values else [None] * len(texts)
    missing = [t for t, k in zip(texts, given, strict=True) if not k]
    if not missing:
        return list(given), None
    # kind decides whether items get a zipf (and so every frequency-controlled statistic): never a silent default
    inferred = infer_kind(missing)
    reason = ("every text is one word without whitespace" if inferred == "word"
              else "some texts are more than one word")
    where = f"its {len(missing)} items" if len(missing) == len(texts) else f"{len(missing)} items without a kind"
    note = (f"kind {inferred!r} inferred for {where} ({reason}); to choose another of {sorted(KINDS)}, add a "
            "kind column or pass --kind to `normaudit probes add`")
    return [k or inferred for k in given], note


def read_probe_file(
    url: str,
    name: str,
    storage_options: dict | None = None,
    *,
    id_col: str = "item_id",
    text_col: str = "text",
    properties: dict[str, str] | None = None,
    kind: str | None = None,
    lang: str | None = None,
) -> ProbeSet:
    """Read a probe file into a validated :class:`ProbeSet` named ``name``.

    Args:
        url: local path or fsspec URL of a .csv, .tsv, .jsonl or .parquet file.
        name: the probe set's name.
        storage_options: fsspec options for ``url`` (S3 endpoint and credentials).
        id_col, text_col: the columns holding item ids and texts (may be the same column).
        properties: property name -> column; ``None`` takes every column other than the item
            columns (``item_id``, ``text``, ``kind``, ``lang``, ``source``, ``id_col``, ``text_col``) under
            its own name.
        kind: kind of every item (overrides a ``kind`` column). Without it, items the ``kind`` column
            leaves empty get the kind :func:`~pipeline.probes.base.infer_kind` infers (``word`` when every
            such text is one whitespace-free token, else ``sentence``), said in the set's ``notes``.
        lang: language of every item (overrides a ``lang`` column; default ``und``).

    Raises:
        ProbeInputError: naming the file and the column, line or row at fault.
    """
    return probe_set_of(read_columns(url, storage_options), name, id_col=id_col, text_col=text_col,
                        properties=properties, kind=kind, lang=lang)


def probe_set_of(cols: Columns, name: str, *, id_col: str = "item_id", text_col: str = "text",
                 properties: dict[str, str] | None = None, kind: str | None = None, lang: str | None = None
                 ) -> ProbeSet:
    """The validated :class:`ProbeSet` of a probe file's columns (see :func:`read_probe_file`); the columns of a
    block of the file give the block's items, with the file's row numbers in its errors."""
    url = cols.url
    role = {id_col: "--id", text_col: "--text"}
    ids = cols.strings(id_col, role[id_col] if id_col != "item_id" else "item id", integers=True)
    texts = cols.strings(text_col, role[text_col] if text_col != "text" else "text")
    kinds, note = _kinds(cols, texts, kind)
    items = pl.DataFrame({
        "item_id": pl.Series(ids, dtype=pl.String),
        "text": pl.Series(texts, dtype=pl.String),
        "kind": kinds,
        "lang": [lang] * len(ids) if lang else _constant_or(cols, "lang", "und"),
        "source": _constant_or(cols, "source", url),
    })
    if properties is None:
        skip = {*ITEM_COLUMNS, id_col, text_col}
        properties = {c: c for c in cols.names if c not in skip}
    frames = [
        pl.DataFrame({"item_id": items["item_id"], "property": prop,
                      "value": pl.Series(cols.numbers(col), dtype=pl.Float64)})
        .filter(pl.col("value").is_not_null())
        for prop, col in properties.items()
    ]
    kwargs = {"properties": pl.concat(frames)} if frames else {}
    ps = with_zipf(ProbeSet(name=name, items=items, origin=url, first_row=cols.first_row, **kwargs))
    if note:
        ps.notes.append(note)
    return ps
