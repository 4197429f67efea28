"""Bad probe input stops with an error naming the row or column; good files load in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.probes import load_probe_set
from pipeline.probes.base import ProbeInputError
from tests.requirements import need_minilm


def _write(path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def test_good_csv_loads_with_properties(tmp_path):
    url = _write(tmp_path / "my-words.csv", "item_id,text,zipf,label\na,apple,4.5,x1\nb,pear,3.25,x2\n")
    with pytest.raises(ProbeInputError, match="column 'label' is not numeric"):
        load_probe_set(url)
    url = _write(tmp_path / "my-words.csv", "item_id,text,zipf\na,apple,4.5\nb,\"pear, ripe\",3.25\n")
    ps = load_probe_set(url)
    assert ps.name == "my-words"
    assert ps.items["text"].to_list() == ["apple", "pear, ripe"]
    assert sorted(ps.properties.rows()) == [("a", "zipf", 4.5), ("b", "zipf", 3.25)]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.csv", "item_id,text\na,apple\nb,\nc,cherry\n", r"empty text in row 2 \(item_id \['b'\]\)"),
        ("dup.csv", "item_id,text\na,apple\nb,pear\na,again\n", r"duplicate item_id \['a'\] in rows 1, 3"),
        ("nocol.csv", "id,text\na,apple\n", r"missing column 'item_id'"),
        ("bad.csv", b"item_id,text\na,apple\nb,p\xe9ar\n", r"invalid UTF-8 at line 3"),
        ("bad.jsonl", '{"item_id": "a", "text": "x"}\n{"item_id": "b", "text": \n', r"line 2 is not valid JSON"),
        ("blank.jsonl", json.dumps({"item_id": "a", "text": "   "}) + "\n", r"empty text in row 1"),
        ("wide.csv", "item_id,text\na,apple,extra\n", r"line 2 has more fields than the header"),
    ],
)
def test_bad_files_name_the_problem(tmp_path, name, content, message):
    url = _write(tmp_path / name, content)
    with pytest.raises(ProbeInputError, match=message) as exc:
        load_probe_set(url)
    assert name in str(exc.value)


def test_unknown_probe_set_suggests_names():
    with pytest.raises(ProbeInputError, match=r"Did you mean \['wordnet-nouns'"):
        load_probe_set("wordnet-noun")


# ---------------------------------------------------------------- limits and choices at `probes add` (CLI)
CLI = str(Path(sys.executable).parent / "normaudit")


def _probes_add(tmp_path, name: str, source, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([CLI, "probes", "add", name, "--from", str(source), "--root", str(tmp_path / "root"),
                           *extra], env=env, capture_output=True, text=True, timeout=120)


def _nothing_stored(tmp_path) -> bool:
    return not list((tmp_path / "root").glob("probes/*/items.parquet"))


@pytest.mark.parametrize(("suffix", "sep"), [(".csv", ","), (".tsv", "\t")])
def test_a_200000_character_cell_is_a_clean_error_naming_line_and_column(tmp_path, suffix, sep):
    path = tmp_path / f"huge{suffix}"
    path.write_text(f"item_id{sep}text\na{sep}apple\nb{sep}\"{'x' * 200_000}\"\nc{sep}pear\n")
    out = _probes_add(tmp_path, "huge", path)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "field larger than field limit" not in out.stderr
    assert out.stderr.startswith(f"error: {path}: column 'text' at line 3 holds 200,000 characters")
    assert _nothing_stored(tmp_path)


def _over_limit_file(tmp_path, suffix: str) -> Path:
    rows = [{"item_id": "a", "text": "short text"}, {"item_id": "b", "text": "y " * 50_001}]
    path = tmp_path / f"long{suffix}"
    if suffix == ".parquet":
        pl.DataFrame(rows).write_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(("suffix", "where"), [(".jsonl", "line 2"), (".parquet", "row 2")])
def test_texts_over_the_limit_are_refused_at_probes_add(tmp_path, suffix, where):
    path = _over_limit_file(tmp_path, suffix)
    out = _probes_add(tmp_path, "long", path)
    assert out.returncode == 1, out.stdout
    assert out.stderr.startswith(f"error: {path}: column 'text' at {where} holds 100,002 characters, over the "
                                 "limit of 100,000"), out.stderr
    assert _nothing_stored(tmp_path)


def test_texts_over_the_limit_are_refused_by_every_reader(tmp_path):
    from pipeline.probes.stored import read_source

    long = "z" * 100_001
    norms = _write(tmp_path / "norms.csv", f"Word,Conc.M,Conc.SD\nok,3.0,1.0\n{long},2.0,1.0\n")
    with pytest.raises(ProbeInputError, match=r"norms.csv: column 'Word' at line 3 holds 100,001 characters"):
        read_source("rating-norms", norms, "norms")
    chaos = _write(tmp_path / "chaos.jsonl", json.dumps(
        {"uid": "u1", "label_counter": {"e": 3}, "example": {"premise": long, "hypothesis": "h"}}) + "\n")
    with pytest.raises(ProbeInputError, match=r"column 'text' in row 1, 2 \(item_id \['pair:u1', 'premise:u1'\]\) "
                                              r"holds 100,003 characters"):
        read_source("label-counts", chaos, "chaos")
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "", "text": long}) + "\n")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "what"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    with pytest.raises(ProbeInputError, match=r"item_id \['d:d1'\]\) holds 100,001 characters"):
        read_source("beir", str(beir), "beir")


@pytest.mark.parametrize(("content", "kind", "zipf"), [
    ("item_id,text\na,dog\nb,cat\nc,qzxqzxv\n", "word", {"a", "b"}),  # qzxqzxv: zipf 0, so no zipf row
    ("item_id,text\na,the dog barked\nb,cat\n", "sentence", set()),
])
def test_kind_is_inferred_and_printed_at_probes_add(tmp_path, content, kind, zipf):
    from pipeline.probes.stored import read_stored
    from pipeline.settings import load_settings
    from pipeline.storage.store import open_store

    path = _write(tmp_path / "mine.csv", content)
    out = _probes_add(tmp_path, "mine", path)
    assert out.returncode == 0, out.stderr
    assert f"note: kind {kind!r} inferred for its" in out.stderr and "--kind" in out.stderr
    assert f"({kind} " in out.stdout  # the summary line counts items per kind
    ps = read_stored(open_store(load_settings(root=str(tmp_path / "root"))), "mine")
    assert set(ps.items["kind"]) == {kind}
    assert set(ps.properties.filter(pl.col("property") == "zipf")["item_id"]) == zipf
    # an explicit --kind is a choice, not an inference: nothing to say
    out = _probes_add(tmp_path, "mine2", path, "--kind", "sentence")
    assert out.returncode == 0 and "inferred" not in out.stderr


def test_items_that_are_only_the_unknown_token_are_counted_at_probes_add(tmp_path):
    need_minilm()
    path = tmp_path / "emoji.csv"
    path.write_text("item_id,text\na,apple\nb,🙂🙂\nc,ⲁⲃⲅ\nd,pear\n", encoding="utf-8")
    out = _probes_add(tmp_path, "emoji", path)
    assert out.returncode == 0, out.stderr  # a warning: the set may be meant for another model
    assert ("warning: probe set 'emoji': 2 of 4 texts are nothing but the unknown token [UNK] for the "
            "tokenizer of the default model 'minilm-l6'") in out.stderr
    assert "item_id ['b', 'c']" in out.stderr
    assert "warning" not in _probes_add(tmp_path, "fruit", _write(tmp_path / "f.csv", "item_id,text\na,apple\n")).stderr
