"""Probe families from their real data: frequency, specificity pairs, templates, rating norms, annotator
distributions, retrieval (BEIR and the reverse dictionary), and the user's own stored sets."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from typer.testing import CliRunner
from wordfreq import zipf_frequency

from pipeline.audit.context import AuditContext
from pipeline.audit.steps import plan_shards
from pipeline.cli.main import app
from pipeline.probes import load_probe_set
from pipeline.probes.base import ProbeInputError
from pipeline.probes.frequency import token_zipf, whole_word, zipf_values
from pipeline.probes.stored import add_probe_set, list_probe_sets, read_stored
from pipeline.settings import load_settings
from pipeline.storage.store import Store, open_store
from tests.conftest import shared_data
from tests.requirements import need_wordnet

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- frequency


def test_zipf_only_for_single_words_wordfreq_knows():
    assert zipf_values(["dog", "ice cream", "qzxqzxv", ""]) == [zipf_frequency("dog", "en"), None, None, None]
    assert zipf_values(["chien"], lang="fr")[0] == zipf_frequency("chien", "fr") > 0
    assert zipf_values(["dog"], lang="tlh") == [None]  # a language wordfreq lacks: no value, not 0


@pytest.mark.parametrize(
    ("tokens", "words"),
    [
        (["[CLS]", "dog", "##s", "the", "[unused0]", "1990", ",", "Dog", "##"], ["dog", "the", "Dog"]),
        (["<s>", "▁the", "▁dog", "s", "▁", "▁1990", "▁"] + ["▁x"] * 3, ["the", "dog", "x", "x", "x"]),
        (["<|endoftext|>", "Ġthe", "Ġdog", "s", "the"], ["the", "dog"]),
    ],
    ids=["wordpiece", "sentencepiece", "bytelevel"],
)
def test_token_zipf_keeps_whole_words_only(tokens, words):
    frame = token_zipf(list(range(len(tokens))), tokens)
    assert frame.columns == ["token_id", "property", "value"]
    kept = [tokens[i] for i in frame["token_id"].to_list()]
    assert [t.lstrip("▁Ġ") for t in kept] == words
    assert frame["value"].to_list() == [zipf_frequency(w, "en") for w in words]
    assert whole_word("##ing", "wordpiece") is None and whole_word("[SEP]", "wordpiece") is None


def test_token_properties_are_written_beside_token_norms_and_viewed(tmp_path):
    from pipeline.audit.steps import write_token_properties
    from pipeline.storage.catalog import open_catalog

    store = Store(str(tmp_path))
    d = store.token_norms_dir("m", "r")
    con = open_catalog(store)
    assert con.execute("select count(*) from token_properties").fetchone()[0] == 0  # empty view, right columns
    norms = pl.DataFrame({"model": "m", "release": "r", "token_id": [0, 1, 2, 3],
                          "token": ["[CLS]", "dog", "##s", "a"], "norm": [1.0, 2.0, 3.0, 4.0]})
    store.write_table(f"{d}/part-0.parquet", norms.to_arrow())  # a root written before token_properties existed
    assert write_token_properties(store, "m", "r") == 2
    assert write_token_properties(store, "m", "r") == 0  # once per release
    rows = open_catalog(store).execute(
        "select n.token, p.property, p.value from token_properties p "
        "join token_norms n using (model, release, token_id) order by n.token").fetchall()
    assert rows == [("a", "zipf", zipf_frequency("a", "en")), ("dog", "zipf", zipf_frequency("dog", "en"))]


def test_word_items_of_a_user_file_get_zipf_unless_given(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("item_id,text,zipf\na,dog,\nb,cat,1.5\nc,qzxqzxv,\n")
    from pipeline.probes.files import read_probe_file

    ps = read_probe_file(str(path), "w", kind="sentence")  # sentences get no zipf made up
    assert ps.properties.rows() == [("b", "zipf", 1.5)]
    # one word per text: kind word is inferred (and said), so a zipf is looked up where none is given
    for ps in (load_probe_set(str(path)), read_probe_file(str(path), "w", kind="word")):
        assert sorted(ps.properties.rows()) == [("a", "zipf", zipf_frequency("dog", "en")), ("b", "zipf", 1.5)]
    assert "kind 'word' inferred" in load_probe_set(str(path)).notes[0]


# ---------------------------------------------------------------- specificity


def test_wordnet_pairs_are_first_sense_direct_hypernyms():
    ps = load_probe_set("wordnet-pairs")
    rel = ps.relations
    assert set(rel["relation"]) == {"hypernym_of"} and set(rel["value"]) == {1.0}
    pairs = set(rel.select("left_id", "right_id").iter_rows())
    assert {("person", "friend"), ("information", "news"), ("man", "guy")} <= pairs
    assert ("food", "dog") not in pairs  # hot dog is not dog's first sense
    # both sides are items with zipf and specificity, and a hypernym is one step above its hyponym
    props = ps.properties.pivot(on="property", index="item_id", values="value")
    joined = rel.join(props.rename(lambda c: f"l_{c}"), left_on="left_id", right_on="l_item_id").join(
        props.rename(lambda c: f"r_{c}"), left_on="right_id", right_on="r_item_id")
    assert joined.height == rel.height
    assert joined.filter(pl.col("l_zipf").is_null() | pl.col("r_zipf").is_null()).height == 0
    # direction: the hypernym's hyponym closure holds the hyponym and all of its own; the hyponym's shortest
    # path to the root is at most one longer than the hypernym's (it may have a shorter one elsewhere)
    assert joined.filter(pl.col("l_n_all_hyponyms") <= pl.col("r_n_all_hyponyms")).height == 0
    assert joined.filter(pl.col("r_min_depth") > pl.col("l_min_depth") + 1).height == 0
    # --limit takes whole pairs: the first 10 items already hold several complete pairs
    assert ps.head(10).relations.height >= 4


def test_shipped_wordnet_pairs_rebuild_identically(tmp_path):
    from pipeline.probes.wordnet_pairs import build_wordnet_pairs

    nouns = REPO / "pipeline/data/wordnet_nouns.parquet"
    out = build_wordnet_pairs(need_wordnet(), nouns, tmp_path / "p.parquet")
    assert pl.read_parquet(out).equals(pl.read_parquet(REPO / "pipeline/data/wordnet_pairs.parquet"))


def test_shipped_pairs_agree_with_wordnet_depths():
    # independent check: in the NLTK-computed lemma table of ../shared, each hyponym's first sense is at most
    # one level deeper (min_depth) than its hypernym's first sense... and at least one level deeper than root
    lemmas = pl.read_csv(shared_data("wordnet") / "wordnet30_noun_lemmas.csv.gz",
                         columns=["lemma", "sense1_min_depth", "sense1_max_depth"])
    rel = load_probe_set("wordnet-pairs").relations
    d = lemmas.rename({"lemma": "w"})
    j = rel.join(d.rename(lambda c: f"l_{c}"), left_on="left_id", right_on="l_w").join(
        d.rename(lambda c: f"r_{c}"), left_on="right_id", right_on="r_w")
    assert j.height == rel.height
    assert j.filter(pl.col("r_sense1_min_depth") > pl.col("l_sense1_max_depth") + 1).height == 0
    assert j.filter(pl.col("r_sense1_max_depth") < pl.col("l_sense1_min_depth") + 1).height == 0


# ---------------------------------------------------------------- templates


def test_template_is_in_the_name_the_text_and_the_shard_hash(tmp_path):
    bare = load_probe_set("wordnet-nouns")
    ps = load_probe_set("wordnet-nouns@this-is-a")
    assert ps.name == "wordnet-nouns@this-is-a" and ps.template == "This is a {}."
    assert ps.items["item_id"].equals(bare.items["item_id"])
    assert ps.items["text"].head(2).to_list() == [f"This is a {t}." for t in bare.items["text"].head(2)]
    assert ps.properties.equals(bare.properties)
    settings = load_settings(root=str(tmp_path), shard_size=8)
    resolved = SimpleNamespace(fingerprint="f" * 64, spec=SimpleNamespace(pooling="mean"), max_length=32)
    ctx = AuditContext(settings, "m", "r", "run", resolved)
    ids = {p.name: [s.shard_id for s in plan_shards(ctx, p, 16)[0]] for p in (bare, ps)}
    assert len(ids[bare.name]) == 2 and not set(ids[bare.name]) & set(ids[ps.name])


def test_templates_refuse_non_word_sets_and_suggest_names():
    with pytest.raises(ProbeInputError, match=r"templates apply to word probes only"):
        load_probe_set("wordnet-reverse-dictionary@this-is-a")
    with pytest.raises(ProbeInputError, match=r"did you mean wordnet-nouns@this-is-a"):
        load_probe_set("wordnet-nouns@this-is-an")


# ---------------------------------------------------------------- human uncertainty: rating norms


def test_brysbaert_norms_load_from_shared_data():
    shared_data("brysbaert_concreteness")
    ps = load_probe_set("brysbaert-concreteness")  # read from ../shared: never shipped
    assert ps.items.height == 37058 and set(ps.items["kind"]) == {"word"}  # 2,896 two-word rows skipped
    props = ps.properties.filter(pl.col("item_id") == "roadsweeper").sort("property").rows()
    assert props == [("roadsweeper", "n_raters", 26.0), ("roadsweeper", "rating_mean", 4.85),
                     ("roadsweeper", "rating_sd", 0.37)]  # no zipf: wordfreq does not know it
    dog = dict(ps.properties.filter(pl.col("item_id") == "dog").select("property", "value").rows())
    assert dog["zipf"] == zipf_frequency("dog", "en") and 0 < dog["rating_sd"] < 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("Word,Conc.M\ndog,4.9\n", r"missing column for 'rating_sd'.*Conc.SD"),
        ("Word,Conc.M,Conc.SD\ndog,4.9,0.3\ncat,high,0.5\n", r"column 'Conc.M' is not numeric: 'high' at line 3"),
        ("Word,Conc.M,Conc.SD\ndog,4.9,0.3\ncat,4.8,0.5\ndog,4.7,0.2\n",
         r"'dog' at line 4 is listed twice \(first at line 2\)"),
        ("Word,Conc.M,Conc.SD\ndog,4.9,0.3\n ,4.8,0.5\n", r"empty word at line 3"),
        ("Word,Conc.M,Conc.SD\ndog,4.9,-0.3\n", r"negative SD"),
    ],
)
def test_bad_rating_norms_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "norms.csv"
    path.write_text(content)
    with pytest.raises(ProbeInputError, match=message) as exc:
        add_probe_set(Store(str(tmp_path / "root")), "norms", str(path), "rating-norms")
    assert str(path) in str(exc.value)
    assert not (tmp_path / "root").exists()  # nothing written


# ---------------------------------------------------------------- human uncertainty: annotator distributions


def test_chaosnli_items_relate_and_entropy_matches_the_dataset():
    path = shared_data("chaosnli") / "chaosNLI_snli.jsonl"
    ps = load_probe_set("chaosnli-snli")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert ps.items.height == 3 * len(lines)
    first = lines[0]["uid"]
    assert ps.items["item_id"].head(3).to_list() == [f"pair:{first}", f"premise:{first}", f"hypothesis:{first}"]
    assert ps.items["kind"].head(3).to_list() == ["pair", "sentence", "sentence"]
    ex = lines[0]["example"]
    assert ps.items["text"].head(3).to_list() == [f"{ex['premise']} {ex['hypothesis']}", ex["premise"],
                                                  ex["hypothesis"]]
    ent = dict(ps.properties.filter(pl.col("item_id").str.starts_with("pair:")).select("item_id", "value").rows())
    assert all(abs(ent[f"pair:{x['uid']}"] - x["entropy"]) < 1e-9 for x in lines)
    assert ps.relations.filter(pl.col("right_id") == f"pair:{first}").sort("relation").rows() == [
        (f"hypothesis:{first}", f"pair:{first}", "hypothesis_of", None),
        (f"premise:{first}", f"pair:{first}", "premise_of", None),
    ]


def _nli(uid, premise="A man sleeps.", hypothesis="A person rests.", counts=None):
    return json.dumps({"uid": uid, "label_counter": counts or {"e": 60, "n": 40},
                       "example": {"premise": premise, "hypothesis": hypothesis}})


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_nli("a"), '{"uid": "b", "label_counter": '], r"line 2 is not valid JSON"),
        ([_nli("a"), "", _nli("a")], r"line 3: uid 'a' is listed twice \(first at line 1\)"),
        ([_nli("a", hypothesis="  ")], r"line 1: empty text in 'example.hypothesis'"),
        ([_nli("a"), json.dumps({"uid": "b", "label_counter": {"1": 3}, "example": {"obs1": "x"}})],
         r"line 2: field 'example.premise' is missing"),
        ([_nli("a", counts={"e": "many"})], r"line 1: label counts"),
    ],
)
def test_bad_annotation_files_name_the_line(tmp_path, lines, message):
    path = tmp_path / "nli.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProbeInputError, match=message) as exc:
        add_probe_set(Store(str(tmp_path / "root")), "nli", str(path), "label-counts")
    assert str(path) in str(exc.value) and not (tmp_path / "root").exists()


# ---------------------------------------------------------------- retrieval


def test_cranfield_loads_as_queries_docs_and_graded_qrels():
    folder = shared_data("cranfield")
    ps = load_probe_set("cranfield")
    kinds = dict(ps.items.group_by("kind").len().rows())
    assert kinds == {"query": 225, "doc": 1398}  # 2 empty documents skipped
    qrels = pl.read_csv(folder / "qrels" / "test.tsv", separator="\t")
    rel = ps.relations
    assert rel.height == qrels.height - 1  # the one judgement of an empty document goes with it
    assert rel.filter(pl.col("relation") == "relevant")["value"].min() == 1.0
    assert set(rel.filter(pl.col("relation") == "not_relevant")["value"]) == {0.0}
    assert ("q:1", "d:184", "relevant", 3.0) in rel.rows()
    # ids are prefixed, query 1 comes first with its relevant documents right after it
    first = qrels.filter((pl.col("query-id") == 1) & (pl.col("score") > 0))["corpus-id"].to_list()
    assert ps.items["item_id"].head(1 + len(first)).to_list() == ["q:1", *[f"d:{d}" for d in first]]
    n_rel = dict(ps.properties.filter(pl.col("property") == "n_relevant").select("item_id", "value").rows())
    assert n_rel["q:1"] == len(first)


def _beir(tmp_path, corpus, queries, qrels, split="test"):
    (tmp_path / "qrels").mkdir(parents=True, exist_ok=True)
    (tmp_path / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (tmp_path / "queries.jsonl").write_text("\n".join(queries) + "\n")
    (tmp_path / "qrels" / f"{split}.tsv").write_text(qrels)
    return str(tmp_path)


DOC = '{"_id": "%s", "title": "T", "text": "some text"}'
QUERY = '{"_id": "%s", "text": "a question"}'


@pytest.mark.parametrize(
    ("corpus", "queries", "qrels", "where", "message"),
    [
        ([DOC % 1, DOC % 1], [QUERY % 1], "query-id\tcorpus-id\tscore\n1\t1\t1\n", "corpus.jsonl",
         r"line 2: duplicate _id '1'"),
        ([DOC % 1], [QUERY % 1, '{"_id": 2, "text": '], "query-id\tcorpus-id\tscore\n", "queries.jsonl",
         r"line 2 is not valid JSON"),
        ([DOC % 1], [QUERY % 1], "query-id\tcorpus-id\tgrade\n1\t1\t1\n", "test.tsv", r"missing column 'score'"),
        ([DOC % 1], [QUERY % 1], "query-id\tcorpus-id\tscore\n1\t1\t1\n1\t9\t1\n", "test.tsv",
         r"line 3: corpus-id '9' is not in"),
        ([DOC % 1], [QUERY % 1], "query-id\tcorpus-id\tscore\n1\t1\thigh\n", "test.tsv", r"line 2: score 'high'"),
        ([DOC % 1], ['{"_id": "1", "text": " "}'], "query-id\tcorpus-id\tscore\n", "queries.jsonl",
         r"line 1: query '1' has empty text"),
        ([DOC % 1], ['{"_id": "1"}'], "query-id\tcorpus-id\tscore\n", "queries.jsonl",
         r"line 1: field 'text' is missing"),
    ],
)
def test_bad_beir_folders_name_file_and_line(tmp_path, corpus, queries, qrels, where, message):
    folder = _beir(tmp_path / "beir", corpus, queries, qrels)
    with pytest.raises(ProbeInputError, match=message) as exc:
        add_probe_set(Store(str(tmp_path / "root")), "ir", folder, "beir")
    assert where in str(exc.value) and not (tmp_path / "root").exists()


def test_reverse_dictionary_has_one_answer_per_query_and_no_leaks():
    ps = load_probe_set("wordnet-reverse-dictionary")
    items = ps.items
    queries, docs = items.filter(pl.col("kind") == "query"), items.filter(pl.col("kind") == "doc")
    assert queries.height == docs.height > 20000
    rel = ps.relations
    assert rel.height == queries.height and rel["left_id"].n_unique() == rel["right_id"].n_unique() == rel.height
    assert (rel["left_id"].str.slice(2) == rel["right_id"].str.slice(2)).all()
    text = dict(items.select("item_id", "text").rows())
    assert text["q:dog"].startswith("a member of the genus Canis") and text["d:dog"] == "dog"
    assert all(f" {text['d:' + q[2:]]} " not in f" {text[q]} " for q in queries["item_id"].head(2000))
    assert '"' not in "".join(queries["text"].head(2000))  # quoted examples stripped
    assert items["item_id"].head(4).to_list()[1::2] == [i.replace("q:", "d:") for i in items["item_id"].head(4)[::2]]


# ---------------------------------------------------------------- the user's own data


def _words_csv(path: Path, rows: list[tuple]) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["word_id", "word", "sd", "note"])
        w.writerows(rows)
    return str(path)


def test_probes_add_stores_a_set_that_audits_and_list_find(tmp_path):
    root = str(tmp_path / "root")
    src = _words_csv(tmp_path / "w.csv", [("w1", "dog", 0.5, "x"), ("w2", "cat", 0.7, "y")])
    runner = CliRunner()
    out = runner.invoke(app, ["probes", "add", "my-words", "--from", src, "--id", "word_id", "--text", "word",
                              "--property", "rating_sd=sd", "--kind", "word", "--root", root])
    assert out.exit_code == 0, out.output
    assert "2 items (word 2)" in out.output and "rating_sd, zipf" in out.output
    store = open_store(load_settings(root=root))
    ps = load_probe_set("my-words", store=store)
    assert ps.items.select("item_id", "text").rows() == [("w1", "dog"), ("w2", "cat")]
    assert ps.properties.filter(pl.col("property") == "rating_sd").rows() == [("w1", "rating_sd", 0.5),
                                                                               ("w2", "rating_sd", 0.7)]
    assert load_probe_set("my-words@a-photo-of-a", store=store).items["text"].to_list() == [
        "a photo of a dog.", "a photo of a cat."]
    # same data again: fine; other data under the name: refused unless --replace
    assert runner.invoke(app, ["probes", "add", "my-words", "--from", src, "--id", "word_id", "--text", "word",
                               "--property", "rating_sd=sd", "--kind", "word", "--root", root]).exit_code == 0
    other = _words_csv(tmp_path / "w2.csv", [("w1", "horse", 0.5, "x")])
    args = ["probes", "add", "my-words", "--from", other, "--id", "word_id", "--text", "word",
            "--property", "sd", "--root", root]
    out = runner.invoke(app, args)
    assert out.exit_code == 1 and "already stored" in out.output and "--replace" in out.output
    assert read_stored(store, "my-words").items["text"].to_list() == ["dog", "cat"]
    assert runner.invoke(app, [*args, "--replace"]).exit_code == 0
    assert read_stored(store, "my-words").items["text"].to_list() == ["horse"]
    listing = list_probe_sets(store)
    row = listing.filter(pl.col("probe_set") == "my-words").row(0, named=True)
    # no --kind this time: one word per text, so kind word is inferred (and printed) and zipf looked up
    assert row["status"] == "stored" and row["kinds"] == "word 1" and row["properties"] == "sd, zipf"
    assert {"wordnet-nouns", "wordnet-pairs", "wordnet-reverse-dictionary"} <= set(listing["probe_set"])
    out = runner.invoke(app, ["probes", "list", "--root", root, "--format", "csv"])
    assert out.exit_code == 0 and "my-words,stored,1," in out.output


@pytest.mark.parametrize(
    ("name", "write", "args", "message"),
    [
        ("w.csv", lambda p: p.write_text("id,word\n1,dog\n"), ["--id", "id"], r"missing column 'text'"),
        ("w.csv", lambda p: p.write_text("id,word\n1,dog\n"), ["--text", "word", "--id", "key"],
         r"missing column 'key' \(the --id column\)"),
        ("w.jsonl", lambda p: p.write_text('{"item_id": "a", "text": "dog", "sd": 0.1}\n{"item_id": "b", "text": "x", '
                                           '"sd": "wide"}\n'), [], r"column 'sd' is not numeric: 'wide' at line 2"),
        ("w.jsonl", lambda p: p.write_text('{"item_id": "a", "text": 7}\n'), [],
         r"column 'text' must hold text but has int 7 at line 1"),
        ("w.parquet", lambda p: pl.DataFrame({"item_id": ["a", "a"], "text": ["x", "y"]}).write_parquet(p), [],
         r"duplicate item_id \['a'\]"),
        ("w.parquet", lambda p: pl.DataFrame({"item_id": ["a", "b"], "text": ["x", None]}).write_parquet(p), [],
         r"empty text in row 2"),
        ("w.parquet", lambda p: pl.DataFrame({"item_id": ["a"], "text": ["x"], "sd": ["?"]}).write_parquet(p),
         ["--property", "sd"], r"column 'sd' is not numeric: '\?' at row 1"),
        ("w.csv", lambda p: p.write_text("item_id,text\na,dog\n"), ["--property", "zipf"],
         r"missing column 'zipf'"),
    ],
)
def test_probes_add_bad_files_name_file_and_column(tmp_path, name, write, args, message):
    path = tmp_path / name
    write(path)
    root = tmp_path / "root"
    out = CliRunner().invoke(app, ["probes", "add", "mine", "--from", str(path), *args, "--root", str(root)])
    assert out.exit_code == 1
    flat = " ".join(out.output.split())
    assert re.search(message, flat), flat
    assert str(path) in flat and not root.exists()


def test_probes_add_from_s3(tmp_path, s3_env):
    import s3fs

    bucket = s3_env.split("/")[2]
    fs = s3fs.S3FileSystem()
    fs.pipe(f"{bucket}/in/words.csv", b"item_id,text,sd\na,dog,0.5\nb,cat,0.25\n")
    fs.pipe(f"{bucket}/in/bad.csv", b"item_id,text\na,dog\nb,\n")
    runner = CliRunner()
    out = runner.invoke(app, ["probes", "add", "s3-words", "--from", f"s3://{bucket}/in/words.csv",
                              "--kind", "word", "--root", s3_env])
    assert out.exit_code == 0, out.output
    store = open_store(load_settings(root=s3_env))
    assert not store.is_local
    ps = load_probe_set("s3-words", store=store)
    assert ps.items["text"].to_list() == ["dog", "cat"]
    assert dict(ps.properties.filter(pl.col("item_id") == "a").select("property", "value").rows()) == {
        "sd": 0.5, "zipf": zipf_frequency("dog", "en")}
    out = runner.invoke(app, ["probes", "add", "s3-bad", "--from", f"s3://{bucket}/in/bad.csv", "--root", s3_env])
    assert out.exit_code == 1 and f"s3://{bucket}/in/bad.csv" in out.output and "empty text in row 2" in out.output
    assert store.glob("probes/probe_set=s3-bad/*") == []


def test_unavailable_external_set_says_how_to_register_it(tmp_path, monkeypatch):
    import pipeline.probes.stored as stored

    monkeypatch.setattr(stored, "shared_data_dirs", lambda: [tmp_path / "nowhere"])
    with pytest.raises(ProbeInputError, match=r"not shipped.*normaudit probes add chaosnli-snli --from PATH"):
        load_probe_set("chaosnli-snli")
    with pytest.raises(ProbeInputError, match=r"is a built-in probe set"):
        add_probe_set(Store(str(tmp_path)), "wordnet-pairs", "x.csv")
