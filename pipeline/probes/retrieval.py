"""Retrieval probe sets: queries and documents in one set, relevance judgements as relations.

Two sources:

* a folder in BEIR layout (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``), local or ``s3://``,
  e.g. ``../shared/data/cranfield``: :func:`read_beir`;
* the built-in ``wordnet-reverse-dictionary``: WordNet glosses as queries, the lemmas they define as
  documents, one relevant document per query: :func:`load_reverse_dictionary`.

Conventions (both): item ids are ``q:<query id>`` (kind ``query``) and ``d:<doc id>`` (kind ``doc``), so
ids are unique across the two; ``probe_relations`` rows are ``(left_id = query item id, right_id = doc
item id, relation, value = relevance grade)`` with relation ``relevant`` for grades > 0 and
``not_relevant`` for judged-irrelevant pairs (grade <= 0, BEIR's convention), so ``relation = 'relevant'``
alone selects the positives. BEIR queries carry the property ``n_relevant``.

Items are ordered query by query — each query, then its relevant documents not listed yet — and the
remaining documents last, so ``--limit N`` embeds queries together with their answers.
"""

from __future__ import annotations

import logging
import posixpath
import re

import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.probes.files import csv_records, jsonl_records, read_text
from pipeline.probes.wordnet import PROPERTIES, SOURCE, load_wordnet_nouns

log = logging.getLogger(__name__)

REVERSE_DICTIONARY = "wordnet-reverse-dictionary"
QRELS_COLUMNS = ("query-id", "corpus-id", "score")


def _field(obj: dict, key: str, url: str, line: int, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        what = "missing" if value is None else f"a {type(value).__name__}, not text"
        raise ProbeInputError(f"{url}: line {line}: field {key!r} is {what}.")
    return str(value)


def _read_ids_and_texts(url: str, records: list[tuple[int, dict]], doc: bool) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for line, obj in records:
        _id = _field(obj, "_id", url, line)
        if _id in out:
            raise ProbeInputError(f"{url}: line {line}: duplicate _id {_id!r} (first at line {out[_id][1]}).")
        text = _field(obj, "text", url, line).strip()
        if doc:
            title = _field(obj, "title", url, line, required=False).strip()
            # BEIR embeds "title text"; some corpora (Cranfield) already start the text with the title
            if title and not text.startswith(title):
                text = f"{title} {text}".strip()
        elif not text:
            raise ProbeInputError(f"{url}: line {line}: query {_id!r} has empty text.")
        out[_id] = (text, line)
    return out


def _read_qrels(url: str, text: str) -> list[tuple[int, str, str, float]]:
    records = csv_records(text, url, delimiter="\t")
    if not records:
        raise ProbeInputError(f"{url}: no judgements.")
    missing = [c for c in QRELS_COLUMNS if c not in records[0][1]]
    if missing:
        raise ProbeInputError(
            f"{url}: missing column {missing[0]!r}; a BEIR qrels file has the header "
            f"{'<TAB>'.join(QRELS_COLUMNS)} (columns present: {list(records[0][1])})."
        )
    out = []
    for line, row in records:
        try:
            score = float(row["score"])
        except (TypeError, ValueError):
            raise ProbeInputError(f"{url}: line {line}: score {row['score']!r} is not a number.") from None
        out.append((line, row["query-id"], row["corpus-id"], score))
    return out


def read_beir(folder: str, name: str, split: str = "test", storage_options: dict | None = None) -> ProbeSet:
    """A BEIR folder as one probe set of queries and documents with their qrels.

    Documents whose title and text are both empty cannot be embedded; they are skipped (with their
    judgements) and logged, as BEIR corpora do contain a few. Everything else that is wrong stops with
    an error naming the file and line: a missing field, a duplicate ``_id``, an empty query, a judgement
    naming an unknown query or document, a score that is not a number.

    Args:
        folder: the folder URL (local path or ``s3://``).
        name: the probe set's name.
        split: which ``qrels/<split>.tsv`` to read.
        storage_options: fsspec options for ``folder``.
    """
    folder = folder.rstrip("/")
    urls = {k: posixpath.join(folder, f) for k, f in
            (("corpus", "corpus.jsonl"), ("queries", "queries.jsonl"), ("qrels", f"qrels/{split}.tsv"))}
    docs = _read_ids_and_texts(urls["corpus"], jsonl_records(read_text(urls["corpus"], storage_options),
                                                             urls["corpus"]), doc=True)
    queries = _read_ids_and_texts(urls["queries"], jsonl_records(read_text(urls["queries"], storage_options),
                                                                 urls["queries"]), doc=False)
    if not docs or not queries:
        raise ProbeInputError(f"{folder}: {'corpus' if not docs else 'queries'} file has no rows.")
    empty = {d for d, (t, _) in docs.items() if not t}
    if empty:
        log.warning("%s: skipping %d documents with empty title and text: %s", urls["corpus"], len(empty),
                    sorted(empty)[:10])
    qrels = []
    for line, q, d, score in _read_qrels(urls["qrels"], read_text(urls["qrels"], storage_options)):
        if q not in queries:
            raise ProbeInputError(
                f"{urls['qrels']}: line {line}: query-id {q!r} is not in {urls['queries']}."
            )
        if d not in docs:
            raise ProbeInputError(
                f"{urls['qrels']}: line {line}: corpus-id {d!r} is not in {urls['corpus']}."
            )
        if d not in empty:
            qrels.append((q, d, score))
    relations = pl.DataFrame(
        {"left_id": [f"q:{q}" for q, _, _ in qrels], "right_id": [f"d:{d}" for _, d, _ in qrels],
         "relation": ["relevant" if s > 0 else "not_relevant" for _, _, s in qrels],
         "value": [s for _, _, s in qrels]},
        schema={"left_id": pl.String, "right_id": pl.String, "relation": pl.String, "value": pl.Float64},
    )
    doc_texts = {d: t for d, (t, _) in docs.items() if d not in empty}
    return _retrieval_set(name, {q: t for q, (t, _) in queries.items()}, doc_texts, relations, "und", folder)


def _retrieval_set(name: str, queries: dict[str, str], docs: dict[str, str], relations: pl.DataFrame,
                   lang: str, source: str, doc_properties: pl.DataFrame | None = None) -> ProbeSet:
    positives = relations.filter(pl.col("relation") == "relevant")
    by_query: dict[str, list[str]] = {}
    for q, d in positives.select("left_id", "right_id").iter_rows():
        by_query.setdefault(q, []).append(d)
    order, seen = [], set()
    for q in queries:
        order.append(f"q:{q}")
        for d in by_query.get(f"q:{q}", []):
            if d not in seen:
                seen.add(d)
                order.append(d)
    order.extend(f"d:{d}" for d in docs if f"d:{d}" not in seen)
    texts = {**{f"q:{q}": t for q, t in queries.items()}, **{f"d:{d}": t for d, t in docs.items()}}
    items = pl.DataFrame({
        "item_id": order, "text": [texts[i] for i in order],
        "kind": ["query" if i.startswith("q:") else "doc" for i in order], "lang": lang, "source": source,
    })
    n_rel = positives.group_by("left_id").len().select(
        pl.col("left_id").alias("item_id"), pl.lit("n_relevant").alias("property"),
        pl.col("len").cast(pl.Float64).alias("value"),
    )
    # a reverse-dictionary query always has one answer: a constant property would only add empty statistics
    props = [n_rel] if doc_properties is None else [doc_properties]
    return ProbeSet(name=name, items=items, properties=pl.concat(props), relations=relations, origin=source)


_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")


def _definition(gloss: str) -> str:
    # "a domesticated canid; "the dog barked all night"": the examples after the definition name the word
    return re.split(r';\s*"', gloss, maxsplit=1)[0].strip().rstrip(";").strip()


def load_reverse_dictionary() -> ProbeSet:
    """``wordnet-reverse-dictionary``: find the noun a WordNet definition defines.

    Built from the shipped ``wordnet-nouns`` table (no WordNet needed): for each lemma, the query is the
    definition of its first sense (the gloss without its quoted examples, which contain the word) and
    the one relevant document is the lemma itself. Dropped: lemmas whose definition contains the lemma
    as a word (the answer would be in the query), and lemmas that share their first-sense definition
    with another lemma (synonyms: a query would have several right answers). Documents carry the
    ``wordnet-nouns`` properties (``zipf``, ``min_depth``, ...); queries have none.
    """
    nouns = load_wordnet_nouns()
    table = pl.read_parquet(nouns.origin, columns=["item_id", "text", "gloss"]).with_columns(
        pl.col("gloss").map_elements(_definition, return_dtype=pl.String).alias("definition")
    )
    leaks = [t in _WORD.findall(d.lower()) for t, d in zip(table["text"], table["definition"], strict=True)]
    table = table.filter(
        ~pl.Series(leaks) & (pl.col("definition").str.len_chars() > 0)
        & (pl.len().over("definition") == 1)
    )
    lemmas = table["item_id"].to_list()
    relations = pl.DataFrame({"left_id": [f"q:{w}" for w in lemmas], "right_id": [f"d:{w}" for w in lemmas],
                              "relation": "relevant", "value": 1.0})
    doc_props = nouns.properties.filter(
        pl.col("item_id").is_in(table["item_id"].implode()) & pl.col("property").is_in(list(PROPERTIES))
    ).with_columns(("d:" + pl.col("item_id")).alias("item_id"))
    ps = _retrieval_set(REVERSE_DICTIONARY, dict(zip(lemmas, table["definition"], strict=True)),
                        dict(zip(lemmas, table["text"], strict=True)), relations, "en", SOURCE, doc_props)
    ps.origin = nouns.origin
    return ps
