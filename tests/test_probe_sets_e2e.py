"""Every probe family audited end to end in one run: real Prefect flow, local Dask, tiny local model.

One module-scoped audit embeds the first items of eight sets: the shipped WordNet sets (bare, templated,
pairs, reverse dictionary), two external sets read from ../shared (ChaosNLI, Cranfield), a slice of the
Brysbaert norms and a user JSONL file, both registered with ``normaudit probes add``.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner
from wordfreq import zipf_frequency

from flows.audit import run_audit
from pipeline.cli.main import app
from pipeline.probes import load_probe_set
from pipeline.settings import load_settings
from pipeline.storage.catalog import open_catalog
from pipeline.storage.store import open_store
from tests.conftest import shared_data

pytestmark = pytest.mark.slow

LIMIT = 24
SETS = ["wordnet-nouns", "wordnet-nouns@this-is-a", "wordnet-pairs", "wordnet-reverse-dictionary",
        "concreteness-slice", "chaosnli-snli", "cranfield", "my-words"]


@pytest.fixture(scope="module")
def audited(tmp_path_factory, tiny_model_dir, prefect_api):
    conc = shared_data("brysbaert_concreteness") / "brysbaert2014_concreteness.csv"
    shared_data("chaosnli")
    shared_data("cranfield")
    tmp = tmp_path_factory.mktemp("e2e-probes")
    root = str(tmp / "root")
    # a slice of the norms, in a temporary folder only (the norms may not be redistributed)
    (tmp / "conc.csv").write_text("".join(conc.read_text().splitlines(keepends=True)[:201]))
    words = [{"key": f"k{i}", "word": w, "familiarity": float(i)} for i, w in
             enumerate(["dog", "cat", "tree", "river", "stone", "bread", "horse", "bird", "apple", "table"])]
    (tmp / "words.jsonl").write_text("".join(json.dumps(w) + "\n" for w in words))
    runner = CliRunner()
    for args in (["concreteness-slice", "--from", str(tmp / "conc.csv"), "--format", "rating-norms"],
                 ["my-words", "--from", str(tmp / "words.jsonl"), "--id", "key", "--text", "word",
                  "--property", "familiarity", "--kind", "word", "--lang", "en"]):
        out = runner.invoke(app, ["probes", "add", *args, "--root", root])
        assert out.exit_code == 0, out.output
    settings = load_settings(root=root, shard_size=16)
    summary = run_audit(settings, str(tiny_model_dir), SETS, release="r1", limit=LIMIT)
    return root, summary


def _con(root):
    return open_catalog(open_store(load_settings(root=root)))


def test_every_family_is_stored_whole_and_embedded_up_to_the_limit(audited):
    root, summary = audited
    con = _con(root)
    store = open_store(load_settings(root=root))
    for name in SETS:
        ps = load_probe_set(name, store=store)
        n_items = con.execute("select count(*) from probe_items where probe_set = ?", [name]).fetchone()[0]
        assert n_items == ps.items.height, name
        embedded = {r[0] for r in con.execute(
            "select item_id from embeddings where probe_set = ? and model = ?", [name, summary.model]).fetchall()}
        assert embedded == set(ps.items["item_id"].head(LIMIT)), name
        assert summary.embedded_items[name] == min(LIMIT, ps.items.height)
    kinds = dict(con.execute("select probe_set, string_agg(distinct kind, ',' order by kind) from probe_items "
                             "group by probe_set").fetchall())
    assert kinds["chaosnli-snli"] == "pair,sentence" and kinds["cranfield"] == "doc,query"
    assert kinds["wordnet-reverse-dictionary"] == "doc,query" and kinds["my-words"] == "word"


def test_family_properties_reach_the_results(audited):
    root, _ = audited
    rows = _con(root).execute(
        "select probe_set, property, n from results where statistic = 'spearman' and value is not null").fetchall()
    got = {(p, prop): n for p, prop, n in rows}
    for key in [("concreteness-slice", "rating_sd"), ("concreteness-slice", "rating_mean"),
                ("chaosnli-snli", "label_entropy"), ("wordnet-pairs", "zipf"),
                ("wordnet-nouns@this-is-a", "min_depth"),
                ("wordnet-reverse-dictionary", "zipf"), ("my-words", "familiarity"), ("my-words", "zipf")]:
        assert key in got, key
    assert got[("chaosnli-snli", "label_entropy")] == LIMIT and got[("my-words", "familiarity")] == 10
    assert got[("wordnet-reverse-dictionary", "zipf")] == LIMIT // 2  # documents only: queries carry n_relevant


def test_template_changes_text_norm_and_shard_hash(audited, tiny_model_dir):
    from pipeline.embedding.embed import Embedder
    from pipeline.embedding.models import get_spec, resolve_model

    root, summary = audited
    con = _con(root)
    rows = con.execute(
        "select b.item_id, t.text, b.norm, e.norm from embeddings b "
        "join embeddings e on e.item_id = b.item_id and e.probe_set = 'wordnet-nouns@this-is-a' "
        "join probe_items t on t.item_id = b.item_id and t.probe_set = e.probe_set "
        "where b.probe_set = 'wordnet-nouns' order by b.item_id").fetchall()
    assert len(rows) == LIMIT
    assert all(text == f"This is a {item_id}." for item_id, text, _, _ in rows)
    bare, templated = np.array([r[2] for r in rows]), np.array([r[3] for r in rows])
    assert not np.allclose(bare, templated)
    direct = Embedder(resolve_model(get_spec(str(tiny_model_dir)))).embed([r[1] for r in rows])
    assert np.allclose(direct.norms, templated, rtol=1e-5)
    store = open_store(load_settings(root=root))
    shard_ids = {p: {part.shard_id for part in store.read_manifest(summary.model, "r1", p).parts}
                 for p in ("wordnet-nouns", "wordnet-nouns@this-is-a")}
    assert len(shard_ids["wordnet-nouns"]) == 2
    assert not shard_ids["wordnet-nouns"] & shard_ids["wordnet-nouns@this-is-a"]


def test_relations_join_embedded_items(audited):
    root, _ = audited
    both_sides = """
        select r.probe_set, r.relation, count(*) from probe_relations r
        join embeddings a on a.probe_set = r.probe_set and a.item_id = r.left_id
        join embeddings b on b.probe_set = r.probe_set and b.item_id = r.right_id
        group by all"""
    got = {(p, r): n for p, r, n in _con(root).execute(both_sides).fetchall()}
    assert got[("wordnet-pairs", "hypernym_of")] >= LIMIT // 3
    assert got[("wordnet-reverse-dictionary", "relevant")] == LIMIT // 2
    assert got[("chaosnli-snli", "premise_of")] == got[("chaosnli-snli", "hypothesis_of")] == LIMIT // 3
    assert got[("cranfield", "relevant")] >= 10  # query 1 and the documents judged relevant to it
    # relation conventions: hypernym on the left, query on the left, sentence -> pair
    conv = _con(root).execute("""
        select r.relation, l.kind, rt.kind from probe_relations r
        join probe_items l on l.probe_set = r.probe_set and l.item_id = r.left_id
        join probe_items rt on rt.probe_set = r.probe_set and rt.item_id = r.right_id
        group by all order by all""").fetchall()
    assert conv == [("hypernym_of", "word", "word"), ("hypothesis_of", "sentence", "pair"),
                    ("not_relevant", "query", "doc"), ("premise_of", "sentence", "pair"), ("relevant", "query", "doc")]


def test_token_properties_give_zipf_of_whole_word_tokens(audited):
    root, summary = audited
    rows = _con(root).execute("""
        select n.token, p.value from token_properties p
        join token_norms n using (model, release, token_id)
        where p.property = 'zipf' and p.model = ? and p.release = 'r1'""", [summary.model]).fetchall()
    tokens = dict(rows)
    assert len(tokens) > 300 and "dog" in tokens and "the" in tokens
    assert not any(t.startswith("##") or t.startswith("[") for t in tokens)
    assert all(v == zipf_frequency(t, "en") for t, v in rows)
    n_norms = _con(root).execute("select count(*) from token_norms where model = ?", [summary.model]).fetchone()[0]
    assert n_norms > len(tokens)  # pieces and special tokens have norms but no zipf


def test_probes_list_counts_stored_sets(audited):
    root, _ = audited
    out = CliRunner().invoke(app, ["probes", "list", "--root", root, "--format", "json"])
    assert out.exit_code == 0, out.output
    listing = {r["probe_set"]: r for r in pl.read_json(out.stdout.encode()).to_dicts()}
    assert listing["my-words"]["items"] == 10 and listing["my-words"]["properties"] == "familiarity, zipf"
    assert listing["concreteness-slice"]["status"] == "stored"
    assert listing["concreteness-slice"]["properties"] == "n_raters, rating_mean, rating_sd, zipf"
    assert listing["cranfield"]["status"] == "external, stored"
    assert listing["wordnet-nouns@this-is-a"]["items"] == listing["wordnet-nouns"]["items"]
    assert listing["wordnet-pairs"]["status"] == "built-in, stored"
