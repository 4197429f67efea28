"""A large probe file prepared in blocks stores exactly what reading it whole stores, and fails the same way.

The whole-file reader (:func:`pipeline.probes.files.read_probe_file`, with :func:`pipeline.probes.stored.
write_probe_tables`) is the reference: the blocks' Columns, the stored tables, the planned shards (against the
Python planner of :mod:`pipeline.storage.shards`) and every error message must equal its own.
"""

from __future__ import annotations

import csv
import io
import json
import random

import polars as pl
import pytest

from pipeline.audit import prepare, steps
from pipeline.audit.context import AuditContext
from pipeline.probes import load_probe_set
from pipeline.probes.base import ProbeInputError
from pipeline.probes.blocks import read_block, split_probe_file
from pipeline.probes.files import read_columns
from pipeline.probes.stored import read_stored, write_probe_tables
from pipeline.settings import Settings
from pipeline.storage.store import Store

N = 1200
BLOCK = 97  # rows per block: a dozen blocks, none aligned to anything


def rows(n: int = N, seed: int = 1, words: bool = False) -> list[dict]:
    rng = random.Random(seed)
    texts = ["plain", 'with "quotes"', "two\nlines", "comma, inside", "crlf\r\ninside", "ünïcödé"]
    out = []
    for i in range(n):
        text = f"w{i}" if words else f"{rng.choice(texts)} {i}"
        out.append({"item_id": f"i{i}", "text": text, "zipf": "" if i % 5 == 0 else str(i % 7)})
    return out


def write_csv(path, records: list[dict], blank_every: int = 89, delimiter: str = ",") -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, list(records[0]), delimiter=delimiter)
    w.writeheader()
    for k, r in enumerate(records):
        w.writerow(r)
        if k % blank_every == 3:
            buf.write("\r\n")  # blank lines are no rows, but count as lines
    path.write_bytes(b"\xef\xbb\xbf" + buf.getvalue().encode())  # with a BOM
    return str(path)


def write_jsonl(path, records: list[dict]) -> str:
    lines = []
    for k, r in enumerate(records):
        lines.append(json.dumps({**r, "zipf": float(r["zipf"]) if r["zipf"] else None}))
        if k % 50 == 7:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path, records: list[dict]) -> str:
    frame = pl.DataFrame(records).with_columns(pl.col("zipf").replace("", None).cast(pl.Float64))
    frame.write_parquet(path, row_group_size=40)
    return str(path)


@pytest.fixture
def files(tmp_path):
    recs = rows()
    return {"csv": write_csv(tmp_path / "set.csv", recs),
            "tsv": write_csv(tmp_path / "set.tsv", recs, delimiter="\t"),
            "jsonl": write_jsonl(tmp_path / "set.jsonl", recs),
            "parquet": write_parquet(tmp_path / "set.parquet", recs)}


def context(tmp_path, tiny_model_dir, **settings) -> AuditContext:
    s = Settings(root=str(tmp_path / "root"), probe_block_rows=BLOCK, **settings)
    return AuditContext(s, "tiny", "r", "run-1", steps.resolve(str(tiny_model_dir)))


def prepare_whole_file(ctx: AuditContext, spec: str, name: str, limit=None, replace=False):
    """What flows/prepare.py runs, in this process and in order (its tasks are these functions)."""
    blocks = prepare.split_probe_file(ctx, spec, name)
    prepared = [prepare.prepare_block(ctx, name, b, limit) for b in blocks]
    return blocks, prepare.assemble_probe_set(ctx, spec, name, prepared, replace, limit)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "parquet"])
def test_the_blocks_read_as_the_whole_file_with_its_line_and_row_numbers(tmp_path, files, fmt):
    store = Store(str(tmp_path / "root"))
    whole = read_columns(files[fmt])
    blocks = split_probe_file(files[fmt], None, store, "prepare/x/set", BLOCK)
    assert len(blocks) > 5
    values, lines = {c: [] for c in whole.names}, []
    for block in blocks:
        cols = read_block(block, store)
        assert cols.first_row == block.first_row and len(next(iter(cols.values.values()))) == block.rows
        for c in whole.names:
            values[c] += cols.values.get(c, [None] * block.rows)
        lines += cols.lines or []
    assert values == whole.values
    assert (lines or None) == whole.lines


@pytest.mark.parametrize("group_rows", [40, 500, N])
def test_a_parquet_file_is_cut_into_blocks_of_the_set_size_whatever_its_row_groups(tmp_path, group_rows):
    """Row groups smaller than a block, larger than it, or the whole file in one: every block has exactly the
    block's rows (the last the rest), and the blocks give the file."""
    store, path = Store(str(tmp_path / "root")), tmp_path / "set.parquet"
    frame = pl.DataFrame(rows()).with_columns(pl.col("zipf").replace("", None).cast(pl.Float64))
    frame.write_parquet(path, row_group_size=group_rows)
    blocks = split_probe_file(str(path), None, store, "prepare/x/set", BLOCK)
    assert [b.rows for b in blocks] == [BLOCK] * (N // BLOCK) + [N % BLOCK]
    assert [b.first_row for b in blocks] == list(range(0, N, BLOCK))
    read = [read_block(b, store) for b in blocks]
    assert sum((c.values["item_id"] for c in read), []) == frame["item_id"].to_list()
    assert sum((c.values["text"] for c in read), []) == frame["text"].to_list()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_file_prepared_in_blocks_stores_what_the_whole_file_stores_and_plans_the_same_shards(
        tmp_path, tiny_model_dir, files, fmt):
    ctx = context(tmp_path, tiny_model_dir, shard_size=128)
    _, assembled = prepare_whole_file(ctx, files[fmt], "set")
    whole = load_probe_set(files[fmt])
    assert assembled.warnings == whole.notes  # the inferred kind, said alike
    stored = read_stored(ctx.store, "set")
    for table in ("items", "properties", "relations"):
        assert getattr(stored, table).equals(getattr(whole, table)), table
    ref = Store(str(tmp_path / "reference"))
    write_probe_tables(ref, whole)
    for table in ("items", "properties"):
        got = pl.read_parquet(ctx.store.path(f"probes/probe_set=set/{table}.parquet"))
        assert got.equals(pl.read_parquet(ref.path(f"probes/probe_set=set/{table}.parquet"))), table
    assert not ctx.store.exists("prepare/run-1")  # the staged blocks are gone
    for limit in (None, 100, 128, 300, N + 5):
        todo, skipped, _, _, later = steps._plan(ctx, whole, limit)  # the Python planner, the reference
        plan = steps.plan_stored_set(ctx, "set", {}, limit)
        assert [r.shard_id for r in plan.refs] == [s.shard_id for s in todo]
        assert [(r.start, r.size) for r in plan.refs] == [(s.start, s.size) for s in todo]
        assert (plan.skipped, plan.later) == (skipped, later)


def test_the_kind_is_inferred_for_the_whole_file_not_per_block(tmp_path, tiny_model_dir):
    """One block of one-word texts must not make its items words when the file's other texts are sentences."""
    recs = [{"item_id": f"i{i}", "text": f"w{i}" if i < 2 * BLOCK else f"two words {i}"} for i in range(4 * BLOCK)]
    spec = write_csv(tmp_path / "mixed.csv", recs)
    ctx = context(tmp_path, tiny_model_dir)
    _, assembled = prepare_whole_file(ctx, spec, "mixed")
    whole = load_probe_set(spec)
    stored = read_stored(ctx.store, "mixed")
    assert set(stored.items["kind"]) == {"sentence"} and stored.properties.height == 0
    assert stored.items.equals(whole.items) and assembled.warnings == whole.notes
    words = write_csv(tmp_path / "words.csv", rows(3 * BLOCK, words=True))
    _, assembled = prepare_whole_file(ctx, words, "words")
    whole = load_probe_set(words)
    stored = read_stored(ctx.store, "words")
    assert set(stored.items["kind"]) == {"word"}
    assert stored.properties.equals(whole.properties) and assembled.warnings == whole.notes


def whole_file_error(spec: str) -> str:
    with pytest.raises(ProbeInputError) as caught:
        load_probe_set(spec)
    return str(caught.value)


def assert_fails_as_the_whole_file(ctx: AuditContext, spec: str, name: str) -> str:
    expected = whole_file_error(spec)
    with pytest.raises(ProbeInputError) as caught:
        prepare_whole_file(ctx, spec, name)
    assert str(caught.value) == expected
    assert not ctx.store.exists(f"probes/probe_set={name}")  # nothing stored
    return expected


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_duplicate_id_near_the_end_fails_with_the_whole_files_message(tmp_path, tiny_model_dir, fmt):
    recs = rows()
    recs[N - 3]["item_id"] = recs[2]["item_id"]  # a dozen blocks apart
    recs[N - 1]["item_id"] = recs[40]["item_id"]
    spec = {"csv": write_csv, "jsonl": write_jsonl, "parquet": write_parquet}[fmt](tmp_path / f"dup.{fmt}", recs)
    message = assert_fails_as_the_whole_file(context(tmp_path, tiny_model_dir), spec, "dup")
    assert "duplicate item_id ['i2', 'i40'] in rows 3, 41, 1198, 1200" in message


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_an_empty_text_near_the_end_fails_with_the_whole_files_message(tmp_path, tiny_model_dir, fmt):
    recs = rows()
    recs[N - 2]["text"] = "  "
    spec = {"csv": write_csv, "jsonl": write_jsonl}[fmt](tmp_path / f"empty.{fmt}", recs)
    message = assert_fails_as_the_whole_file(context(tmp_path, tiny_model_dir), spec, "empty")
    assert f"empty text in row {N - 1} (item_id ['i{N - 2}'])" in message


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_bad_utf8_near_the_end_fails_with_the_whole_files_line_and_byte(tmp_path, tiny_model_dir, fmt):
    path = tmp_path / f"bad.{fmt}"
    ({"csv": write_csv, "jsonl": write_jsonl}[fmt])(path, rows())
    data = path.read_bytes()
    at = data.rindex(b"i1190")
    path.write_bytes(data[:at] + b"\xff" + data[at + 1:])
    message = assert_fails_as_the_whole_file(context(tmp_path, tiny_model_dir), str(path), "bad")
    line = data[:at].count(b"\n") + 1
    assert f"invalid UTF-8 at line {line} (byte {at})" in message


def test_a_bad_value_in_a_later_block_names_the_files_line_and_column(tmp_path, tiny_model_dir):
    recs = rows()
    recs[N - 10]["zipf"] = "high"
    spec = write_csv(tmp_path / "prop.csv", recs)
    message = assert_fails_as_the_whole_file(context(tmp_path, tiny_model_dir), spec, "prop")
    assert "column 'zipf' is not numeric: 'high' at line" in message


def test_a_changed_file_is_refused_as_a_whole_file_is_and_the_same_one_is_left_alone(tmp_path, tiny_model_dir):
    ctx = context(tmp_path, tiny_model_dir)
    (tmp_path / "a").mkdir()
    first = write_csv(tmp_path / "a" / "set.csv", rows())
    prepare_whole_file(ctx, first, "set")
    items = ctx.store.path("probes/probe_set=set/items.parquet")
    before = pl.read_parquet(items)
    prepare_whole_file(ctx, first, "set")  # the same data again: accepted, nothing rewritten
    assert pl.read_parquet(items).equals(before)
    recs = rows()
    recs[N - 1]["text"] = "changed"
    recs.append({"item_id": "new", "text": "added", "zipf": "1"})
    (tmp_path / "b").mkdir()
    second = write_csv(tmp_path / "b" / "set.csv", recs)
    with pytest.raises(ProbeInputError) as caught:
        prepare_whole_file(ctx, second, "set")
    message = str(caught.value)
    assert "(1 text changed, 1 item added)" in message and "nothing was written" in message
    assert "--replace" in message and pl.read_parquet(items).equals(before)
    prepare_whole_file(ctx, second, "set", replace=True)
    assert read_stored(ctx.store, "set").items.equals(load_probe_set(second).items)


def test_unknown_token_texts_in_later_blocks_are_said_as_for_the_whole_file(tmp_path, tiny_model_dir, monkeypatch):
    from pipeline.audit import preflight

    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_BYTES", 10)  # the whole-file check runs on "large" files only
    recs = rows()
    for k in (5, 700, 1100):
        recs[k]["text"] = "🙂🙂 ⲁⲃⲅ"
    spec = write_csv(tmp_path / "emoji.csv", recs)
    ctx = context(tmp_path, tiny_model_dir)
    for limit in (None, 800):
        _, assembled = prepare_whole_file(ctx, spec, "emoji", limit)
        expected = preflight.unknown_token_warning(ctx.settings, ctx.resolved, load_probe_set(spec), spec, limit)
        assert expected and assembled.warnings[-1] == expected
    assert "2 of 800 texts" in expected
    unknown = write_csv(tmp_path / "unknown.csv", [{"item_id": f"u{i}", "text": "🙂"} for i in range(300)])
    with pytest.raises(ProbeInputError, match="all 300 texts"):
        prepare_whole_file(ctx, unknown, "unknown")
    assert not ctx.store.exists("probes/probe_set=unknown")


def test_an_s3_file_on_an_s3_root_is_prepared_in_blocks_as_a_local_one(tmp_path, tiny_model_dir, files, s3_env):
    """The blocks, the staged parts, DuckDB's reads of them and the stored tables all go through the root's s3fs
    (a real S3 server on loopback)."""
    import fsspec

    from pipeline.settings import load_settings

    settings = load_settings(root=s3_env, probe_block_rows=BLOCK, shard_size=128)
    ctx = AuditContext(settings, "tiny", "r", "run-1", steps.resolve(str(tiny_model_dir)))
    fs = fsspec.filesystem("s3", **settings.storage_options())
    for fmt in ("csv", "parquet"):
        url = f"{s3_env}/in/set-{fmt}.{fmt}"
        fs.put_file(files[fmt], url)
        _, assembled = prepare_whole_file(ctx, url, f"set-{fmt}")
        stored = read_stored(ctx.store, f"set-{fmt}")
        whole = load_probe_set(files[fmt])
        assert stored.items.drop("source").equals(whole.items.drop("source"))  # the source names the URL read
        assert stored.properties.equals(whole.properties)
        assert set(stored.items["source"]) == {url}
        plan = steps.plan_stored_set(ctx, f"set-{fmt}", {}, None)
        assert [r.start for r in plan.refs] == list(range(0, N, 128)) and plan.skipped == 0
    assert ctx.store.glob("prepare/*") == []


@pytest.mark.parametrize("root", ["local", "s3"])
def test_a_large_stored_set_audited_by_name_is_planned_from_its_files_as_when_loaded(
        tmp_path, tiny_model_dir, monkeypatch, request, root):
    """A set stored under the root (as ``normaudit probes add`` stores it) and over the pre-flight's size is
    planned from its files and its texts checked a block at a time: the same shards and the same unknown-token
    warning as the whole set gives, with and without --limit; the whole-set route is made to fail, so it is
    never taken. Built-in sets and templates still go the whole way. On a local root and on an S3 one (a real
    S3 server on loopback: each block is read through the store's s3fs and retries)."""
    from pipeline.audit import preflight, stored_set
    from pipeline.settings import load_settings

    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_BYTES", 10)  # every stored set is "large" now
    monkeypatch.setattr(stored_set, "BLOCK_ROWS", BLOCK)
    recs = rows()
    for k in (5, 700, 1100):
        recs[k]["text"] = "🙂🙂 ⲁⲃⲅ"
    if root == "s3":
        settings = load_settings(root=request.getfixturevalue("s3_env"), probe_block_rows=BLOCK, shard_size=128)
        ctx = AuditContext(settings, "tiny", "r", "run-1", steps.resolve(str(tiny_model_dir)))
    else:
        ctx = context(tmp_path, tiny_model_dir, shard_size=128)
    write_probe_tables(ctx.store, load_probe_set(write_csv(tmp_path / "emoji.csv", recs)))
    whole = read_stored(ctx.store, "emoji")
    expected = {}
    for limit in (None, 800, 5, N + 5):
        todo, skipped, _, _, later = steps._plan(ctx, whole, limit)  # the Python planner, on the loaded set
        warning = preflight.unknown_token_warning(ctx.settings, ctx.resolved, whole, "emoji", limit)
        expected[limit] = ([(s.shard_id, s.start, s.size) for s in todo], skipped, later, [warning] if warning else [])

    def loaded_whole(*args):
        raise AssertionError(f"the stored set was loaded whole: {args[1:]}")

    monkeypatch.setattr(steps, "load_and_store_probes", loaded_whole)
    monkeypatch.setattr(steps, "run_in_child", loaded_whole)
    for limit, (shards, skipped, later, warnings) in expected.items():
        plan = steps.prepare_probes(ctx, "emoji", limit)
        assert [(r.shard_id, r.start, r.size) for r in plan.refs] == shards
        assert (plan.skipped, plan.later, plan.warnings) == (skipped, later, warnings)
    assert "2 of 800 texts" in expected[800][3][0] and "3 of 1200 texts" in expected[None][3][0]
    assert expected[5][3] == []  # no unknown text among the first 5
    write_probe_tables(ctx.store, load_probe_set(write_csv(
        tmp_path / "unknown.csv", [{"item_id": f"u{i}", "text": "🙂"} for i in range(300)])))
    with pytest.raises(ProbeInputError, match="all 300 texts"):
        steps.prepare_probes(ctx, "unknown")
    def planned(spec: str) -> bool:
        return stored_set.planned_from_store(spec, preflight.checked_on_worker(spec, ctx.settings, ctx.store))

    assert planned("emoji")
    for spec in ("wordnet-nouns", "emoji@sentence", str(tmp_path / "emoji.csv"), "absent"):
        assert not planned(spec), spec
