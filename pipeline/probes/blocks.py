"""A probe file read in blocks of rows, so that no process ever holds the whole file.

:func:`split_probe_file` cuts a CSV, TSV or JSONL file into blocks at record boundaries in one streaming pass
(a CSV record may span lines inside quotes: Python's ``csv`` reader, fed one line at a time, says where each
record ends) and writes each block's bytes under a folder of the store; a Parquet file is cut into row ranges
from its footer alone, each read as a shard's rows are (:func:`pipeline.storage.shards.read_rows`).
:func:`read_block` gives one block's :class:`~pipeline.probes.files.Columns`, numbered as in the whole file, so
every error names the file's line, row and column exactly as reading the whole file does
(:func:`pipeline.probes.files.read_columns`). Blocks are then prepared in parallel, one task each.
"""

from __future__ import annotations

import csv
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import polars as pl
import pyarrow.parquet as pq

from pipeline.probes.base import ProbeInputError
from pipeline.probes.files import (
    FORMATS,
    Columns,
    allow_fields_up_to,
    columns_of,
    csv_records,
    decode_utf8,
    jsonl_records,
)
from pipeline.storage.shards import read_rows
from pipeline.storage.store import Store

MAX_FIELD = (1 << 31) - 1  # the csv module's largest field limit
BLOCK_ROWS = 131072  # rows per block (settings.probe_block_rows): ~0.2 GiB of a worker's memory at most


@dataclass(frozen=True)
class BlockSource:
    """Where one block's rows are: a part of the file written to the store (``rel``) or row groups of a
    Parquet file (``groups``), and where they sit in the whole file (for error messages and order)."""

    index: int
    url: str  # the user's file, which every message names
    fmt: str
    first_row: int  # data rows of the file before this block
    rows: int
    rel: str | None = None  # CSV/TSV/JSONL: the block's bytes (with the header line of a CSV) under the root
    header_lines: int = 0  # physical lines of that header
    first_line: int = 1  # file line of the block's first row
    first_byte: int = 0  # file byte offset of the block's first row


def file_format(url: str) -> str:
    """The extension that decides how ``url`` is read (``.csv``, ``.tsv``, ``.jsonl``, ``.ndjson``, ``.parquet``)."""
    fmt = posixpath.splitext(url.split("?")[0])[1].lower()
    if fmt not in FORMATS:
        raise ProbeInputError(f"{url}: unknown probe file type {fmt!r}; use .csv, .tsv, .jsonl or .parquet.")
    return fmt


def split_probe_file(url: str, storage_options: dict | None, store: Store, folder: str,
                     block_rows: int = BLOCK_ROWS) -> list[BlockSource]:
    """Cut the probe file ``url`` into blocks of about ``block_rows`` rows (CSV/JSONL blocks written under
    ``folder`` of ``store``); raises :class:`ProbeInputError` for a missing or empty file."""
    fmt = file_format(url)
    try:
        if fmt == ".parquet":
            blocks = _parquet_blocks(url, storage_options, block_rows)
        else:
            with fsspec.open(url, "rb", **(storage_options or {})) as fh:
                blocks = list(_text_blocks(fh, url, fmt, store, folder, block_rows))
    except FileNotFoundError as exc:
        raise ProbeInputError(f"{url}: no such file; check the path (or bucket and key for s3://).") from exc
    if not blocks or not sum(b.rows for b in blocks):
        raise ProbeInputError(f"{url}: no rows.")
    return blocks


def _parquet_blocks(url: str, storage_options: dict | None, block_rows: int) -> list[BlockSource]:
    with fsspec.open(url, "rb", **(storage_options or {})) as fh:
        try:
            meta = pq.ParquetFile(fh).metadata
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
            raise ProbeInputError(f"{url}: not a readable Parquet file ({exc}).") from exc
    # blocks are row ranges of block_rows, as a text file's are, whatever the writer's row groups: a file written
    # with 1 M-row groups (pyarrow's default) still gives blocks that fit a worker
    total = meta.num_rows
    return [BlockSource(k, url, ".parquet", first, min(block_rows, total - first))
            for k, first in enumerate(range(0, total, block_rows))]


class _Lines:
    """The file's lines, decoded for the ``csv`` reader, keeping the raw bytes of those not yet written."""

    def __init__(self, fh):
        self.fh, self.taken, self.lines = fh, [], 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        raw = self.fh.readline()
        if not raw:
            raise StopIteration
        self.taken.append(raw)
        self.lines += 1
        # invalid bytes are reported by the block's own strict decoding (with the file's line and byte)
        return raw.decode("utf-8", errors="surrogateescape")

    def take(self) -> bytes:
        data, self.taken = b"".join(self.taken), []
        return data


def _text_blocks(fh, url: str, fmt: str, store: Store, folder: str, block_rows: int) -> Iterator[BlockSource]:
    lines = _Lines(fh)
    header, header_lines = b"", 0
    if fmt in (".csv", ".tsv"):
        allow_fields_up_to(MAX_FIELD)  # the block's reader checks each field's length, naming its line
        reader = csv.reader(lines, delimiter="\t" if fmt == ".tsv" else ",")
        try:
            next(reader)  # the header: its bytes go in front of every block
        except StopIteration:
            return
        except csv.Error:
            pass  # the first block's reader reports it, with its line
        header, header_lines = lines.take(), lines.lines
        records = _csv_record_ends(reader)
    else:
        records = _jsonl_record_ends(lines)
    index = rows = first_row = 0
    line, byte = header_lines + 1, len(header)
    for _ in records:
        rows += 1
        if rows == block_rows:
            data = lines.take()
            yield _write_block(store, folder, index, url, fmt, header, header_lines, first_row, rows, line, byte,
                               data)
            index, first_row, line, byte, rows = index + 1, first_row + rows, lines.lines + 1, byte + len(data), 0
    data = lines.take()
    if rows or data.strip():
        yield _write_block(store, folder, index, url, fmt, header, header_lines, first_row, rows, line, byte, data)


def _csv_record_ends(reader) -> Iterator[None]:
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error:
            continue  # the block's reader reports it, with its line
        if row:  # csv.DictReader skips blank lines: they are no row
            yield None


def _jsonl_record_ends(lines: _Lines) -> Iterator[None]:
    for line in lines:
        if line.strip():
            yield None


def _write_block(store: Store, folder: str, index: int, url: str, fmt: str, header: bytes, header_lines: int,
                 first_row: int, rows: int, line: int, byte: int, data: bytes) -> BlockSource:
    rel = f"{folder}/block-{index:05d}{fmt}"
    store.write_bytes_atomic(rel, header + data)
    return BlockSource(index, url, fmt, first_row, rows, rel, header_lines, line, byte)


def read_block(block: BlockSource, store: Store, storage_options: dict | None = None) -> Columns:
    """The :class:`Columns` of one block, with the whole file's line and row numbers."""
    if block.fmt == ".parquet":
        with fsspec.open(block.url, "rb", **(storage_options or {})) as fh:
            try:
                table = read_rows(pq.ParquetFile(fh), block.first_row, block.rows)
            except Exception as exc:  # noqa: BLE001 - as in read_columns: any unreadable Parquet
                raise ProbeInputError(f"{block.url}: not a readable Parquet file ({exc}).") from exc
        df = pl.from_arrow(table)
        return Columns(block.url, df.columns, {c: df[c].to_list() for c in df.columns}, None, block.first_row)
    data = store.read_bytes(block.rel)
    if block.fmt in (".jsonl", ".ndjson"):
        text = decode_utf8(data, block.url, block.first_line, block.first_byte)
        records = jsonl_records(text, block.url, block.first_line)
    else:
        header = data[: len(data) - len(data.split(b"\n", block.header_lines)[-1])] if block.header_lines else b""
        decode_utf8(header, block.url)  # the header's own bad bytes, by the file's first lines
        body = decode_utf8(data[len(header):], block.url, block.first_line, block.first_byte)
        records = csv_records(header.decode("utf-8-sig") + body, block.url, "\t" if block.fmt == ".tsv" else ",",
                              line_offset=block.first_line - 1 - block.header_lines)
    if not records:
        raise ProbeInputError(f"{block.url}: no rows.")
    return columns_of(block.url, records, block.first_row)


__all__ = ["BLOCK_ROWS", "BlockSource", "file_format", "read_block", "split_probe_file"]
