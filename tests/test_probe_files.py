"""Bad probe input stops with an error naming the row or column; good files load in full."""

from __future__ import annotations

import json

import pytest

from pipeline.probes import load_probe_set
from pipeline.probes.base import ProbeInputError


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
