"""The ``wordnet-nouns`` probe set: common English nouns with WordNet 3.0 specificity measures.

The shipped table (``pipeline/data/wordnet_nouns.parquet``) is built once from the WordNet database
files by :func:`build_wordnet_nouns`; audits only read it with :func:`load_wordnet_nouns`. The database
files are parsed here directly (format ``wndb(5WN)``) rather than through NLTK, so building needs no
NLTK data download and no ``lexnames`` file.

Measures follow NLTK's definitions, so they can be checked against NLTK-computed tables:
``min_depth`` is the shortest hypernym path to a root (the root has depth 0) and, like
``n_hypernym_paths``, follows both hypernym (``@``) and instance-hypernym (``@i``) pointers;
hyponym counts follow ``~`` and ``~i``.

Building also reads ``cntlist.rev`` (SemCor tag counts per sense key, format ``cntlist(5WN)``), for
the part-of-speech filter described in :func:`build_wordnet_nouns`.
"""

from __future__ import annotations

import re
from collections import deque
from importlib import resources
from pathlib import Path

import polars as pl

from pipeline.probes.base import ProbeSet

PROBE_SET_NAME = "wordnet-nouns"
SOURCE = "wordnet-3.0"
DATA_FILE = "wordnet_nouns.parquet"
PROPERTIES = ("min_depth", "n_hypernym_paths", "n_direct_hyponyms", "n_all_hyponyms", "n_senses", "zipf")

# Zipf at or above which a lemma with no SemCor-tagged noun sense counts as a function word (see
# build_wordnet_nouns): 5.0 is about once per 100,000 words (e.g. "he", "have", "at" are 6-7).
FUNCTION_WORD_ZIPF = 5.0

_HYPERNYM = frozenset({"@", "@i"})
_HYPONYM = frozenset({"~", "~i"})
# Plain single words only: the probe embeds bare nouns, and digits or apostrophes ('hood, .22) would
# measure tokenizer quirks rather than specificity. Hyphens are allowed (bow-wow), spaces are not:
# wordfreq scores a phrase by its rarest word, so "the like" or "good will" would rank near the top.
# (wordfreq also splits at hyphens, so hyphenated lemmas such as know-how or make-work still get such a
# phrase estimate.)
_COMMON_TEXT = re.compile(r"[a-z][a-z-]*")
# cntlist.rev sense keys: lemma%ss_type:lex_filenum:lex_id:head_word:head_id. ss_type 5 (adjective
# satellite) is an adjective like ss_type 3; index.adj lists both under one lemma.
_SS_TYPE_POS = {"1": "noun", "2": "verb", "3": "adj", "4": "adv", "5": "adj"}
_OTHER_POS = ("verb", "adj", "adv")
_CNTLIST_LINE = re.compile(r"([^%\s]+)%([1-5]):\d\d:\d\d:[^:\s]*:(?:\d\d)? \d+ (\d+)")
_READ_SCHEMA = {
    "item_id": pl.String, "text": pl.String, "synset_offset": pl.Int64, "gloss": pl.String,
    "is_instance": pl.Boolean, "has_instance_hypernym": pl.Boolean, "min_depth": pl.Int64,
    "n_hypernym_paths": pl.Int64, "n_direct_hyponyms": pl.Int64, "n_all_hyponyms": pl.Int64,
    "n_senses": pl.Int64,
}


class _Synset:
    __slots__ = ("hypernyms", "hyponyms", "has_hypernym", "has_instance_hypernym", "gloss")

    def __init__(self) -> None:
        self.hypernyms: set[int] = set()
        self.hyponyms: set[int] = set()
        self.has_hypernym = False
        self.has_instance_hypernym = False
        self.gloss = ""


def require_file(db_dir: Path, name: str) -> Path:
    """``db_dir/name``; a missing file raises naming the folder and how to install WordNet."""
    path = db_dir / name
    if not path.is_file():
        raise FileNotFoundError(
            f"WordNet database folder {str(db_dir)!r} has no file {name!r} (looked for {str(path)!r}); "
            "point to a WordNet 3.0 'dict' folder, e.g. /usr/share/wordnet after "
            "`apt-get install wordnet-base`."
        )
    return path


def _data_lines(path: Path):
    # The licence header lines start with two spaces; everything else is one record per line.
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith("  ") or not line.strip():
                continue
            yield lineno, line


def parse_data_noun(path: Path) -> dict[int, _Synset]:
    """WordNet's ``data.noun`` as ``synset offset -> synset`` (words, hypernym offsets, gloss)."""
    synsets: dict[int, _Synset] = {}
    for lineno, line in _data_lines(path):
        record, _, gloss = line.partition(" | ")
        f = record.split()
        try:
            offset = int(f[0])
            w_cnt = int(f[3], 16)
            i = 4 + 2 * w_cnt
            p_cnt = int(f[i])
            ptrs = f[i + 1 : i + 1 + 4 * p_cnt]
        except (IndexError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a wndb(5WN) data line ({exc})") from exc
        if len(ptrs) != 4 * p_cnt:
            raise ValueError(f"{path}:{lineno}: expected {p_cnt} pointers, line is truncated")
        s = _Synset()
        s.gloss = gloss.strip()
        for k in range(0, len(ptrs), 4):
            symbol, target, pos = ptrs[k], int(ptrs[k + 1]), ptrs[k + 2]
            if pos != "n":
                continue
            if symbol in _HYPERNYM:
                s.hypernyms.add(target)
                if symbol == "@":
                    s.has_hypernym = True
                else:
                    s.has_instance_hypernym = True
            elif symbol in _HYPONYM:
                s.hyponyms.add(target)
        synsets[offset] = s
    return synsets


def _parse_index_noun(path: Path) -> list[tuple[str, int, int]]:
    """(lemma, n_senses, first synset offset) per index line, in file order."""
    rows = []
    for lineno, line in _data_lines(path):
        f = line.split()
        try:
            lemma, synset_cnt, p_cnt = f[0], int(f[2]), int(f[3])
            offsets = f[4 + p_cnt + 2 :]
            first = int(offsets[0])
        except (IndexError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a wndb(5WN) index line ({exc})") from exc
        if len(offsets) != synset_cnt:
            raise ValueError(f"{path}:{lineno}: synset_cnt {synset_cnt} but {len(offsets)} offsets listed")
        rows.append((lemma, synset_cnt, first))
    return rows


def _parse_cntlist(path: Path) -> dict[str, dict[str, int]]:
    """lemma -> {part of speech -> SemCor tags summed over its senses} from ``cntlist.rev``.

    Each line is ``sense_key sense_number tag_cnt``; only tagged senses are listed, so a part of speech
    that is absent has 0 tags.
    """
    tags: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            m = _CNTLIST_LINE.fullmatch(line.strip())
            if m is None:
                raise ValueError(
                    f"{path}:{lineno}: not a cntlist.rev line "
                    f"(sense_key sense_number tag_cnt): {line.strip()!r}"
                )
            lemma, ss_type, tag_cnt = m.groups()
            per_pos = tags.setdefault(lemma, {})
            pos = _SS_TYPE_POS[ss_type]
            per_pos[pos] = per_pos.get(pos, 0) + int(tag_cnt)
    return tags


def _depths_and_paths(synsets: dict[int, _Synset]) -> tuple[dict[int, int], dict[int, int]]:
    # Kahn's algorithm from the roots down, so each synset is finished after all its hypernyms;
    # this is the iterative form of NLTK's recursive min_depth() / hypernym_paths().
    children: dict[int, list[int]] = {o: [] for o in synsets}
    pending = {}
    for o, s in synsets.items():
        parents = [p for p in s.hypernyms if p in synsets]
        pending[o] = len(parents)
        for p in parents:
            children[p].append(o)
    queue = deque(o for o, n in pending.items() if n == 0)
    depth = dict.fromkeys(queue, 0)
    paths = dict.fromkeys(queue, 1)
    while queue:
        o = queue.popleft()
        for c in children[o]:
            depth[c] = min(depth.get(c, depth[o] + 1), depth[o] + 1)
            paths[c] = paths.get(c, 0) + paths[o]
            pending[c] -= 1
            if pending[c] == 0:
                queue.append(c)
    if len(depth) != len(synsets) or any(pending.values()):
        stuck = sorted(o for o, n in pending.items() if n)[:5]
        raise ValueError(f"WordNet hypernym pointers form a cycle through synsets {stuck}")
    return depth, paths


def _hyponym_closure_size(synsets: dict[int, _Synset], offset: int, cache: dict[int, int]) -> int:
    if offset not in cache:
        seen: set[int] = set()
        stack = list(synsets[offset].hyponyms)
        while stack:
            o = stack.pop()
            if o in seen or o == offset or o not in synsets:
                continue
            seen.add(o)
            stack.extend(synsets[o].hyponyms)
        cache[offset] = len(seen)
    return cache[offset]


def read_wordnet_nouns(db_dir: str | Path) -> pl.DataFrame:
    """Every noun lemma of a WordNet 3.0 database folder, described by its first sense.

    Reads ``index.noun`` and ``data.noun`` from ``db_dir``. One row per lemma in ``index.noun`` order:
    ``item_id`` (the lemma, e.g. ``ice_cream``), ``text`` (``ice cream``), ``synset_offset`` and
    ``gloss`` of the first sense, ``is_instance`` (first sense is an instance: ``@i`` pointer, no ``@``),
    ``has_instance_hypernym`` (first sense has any ``@i`` pointer, NLTK's notion of an instance),
    ``min_depth``, ``n_hypernym_paths``, ``n_direct_hyponyms``, ``n_all_hyponyms`` (distinct synsets
    reachable by ``~``/``~i``) of the first sense, and ``n_senses`` (noun senses of the lemma).

    Raises ``FileNotFoundError`` naming the folder and file when either file is missing.
    """
    db_dir = Path(db_dir)
    index_path = require_file(db_dir, "index.noun")
    data_path = require_file(db_dir, "data.noun")
    synsets = parse_data_noun(data_path)
    depth, paths = _depths_and_paths(synsets)
    closure: dict[int, int] = {}
    cols: dict[str, list] = {name: [] for name in _READ_SCHEMA}
    for lemma, n_senses, offset in _parse_index_noun(index_path):
        s = synsets.get(offset)
        if s is None:
            raise ValueError(
                f"{index_path}: lemma {lemma!r} points to synset {offset:08d}, which {data_path} lacks"
            )
        cols["item_id"].append(lemma)
        cols["text"].append(lemma.replace("_", " "))
        cols["synset_offset"].append(offset)
        cols["gloss"].append(s.gloss)
        cols["is_instance"].append(s.has_instance_hypernym and not s.has_hypernym)
        cols["has_instance_hypernym"].append(s.has_instance_hypernym)
        cols["min_depth"].append(depth[offset])
        cols["n_hypernym_paths"].append(paths[offset])
        cols["n_direct_hyponyms"].append(len(s.hyponyms))
        cols["n_all_hyponyms"].append(_hyponym_closure_size(synsets, offset, closure))
        cols["n_senses"].append(n_senses)
    return pl.DataFrame(cols, schema=_READ_SCHEMA)


def build_wordnet_nouns(db_dir: str | Path, out_path: str | Path) -> Path:
    """Write the compact ``wordnet-nouns`` Parquet from a WordNet 3.0 database folder; return its path.

    Keeps common single-word nouns: first sense has no instance hypernym (drops proper names), text of
    lowercase ASCII letters and hyphens only (no multiword lemmas), and ``wordfreq`` Zipf frequency > 0.
    Rows are in the stable order that ``--limit N`` uses: descending ``zipf``, then ``item_id``.

    Multiword lemmas are dropped because ``wordfreq`` scores a phrase by its rarest word (roughly), so
    ``the_like`` or ``good_will`` got the Zipf of a function word and ranked at the very top.

    Then drops lemmas that are mostly not nouns, judged by the SemCor tag counts in ``cntlist.rev``
    (how many tokens of each sense were tagged in the semantic concordance), summed per lemma and part of
    speech (adjective satellites count as adjectives):

    (a) the verb, adjective or adverb senses of the lemma have more tags than its noun senses (``be``:
        0 noun tags, ~16,700 verb tags; ``have``, ``do``, ``make`` likewise);
    (b) no noun sense was ever tagged and Zipf >= :data:`FUNCTION_WORD_ZIPF` (``it``, ``he``, ``at``:
        in WordNet only as obscure nouns such as information technology, helium or astatine).

    Why: WordNet lists every string that has *some* noun sense, so the most frequent "nouns" by Zipf are
    function words and verbs whose first noun sense is obscure (``be`` = beryllium, ``are`` = the unit of
    area). Their Zipf measures the word, not that sense, and they would fill the head of the list that
    ``--limit N`` takes. SemCor tags show how the lemma is really used. Token counts are used rather than
    the ``tagsense_cnt`` field of the ``index.*`` files, which only counts *senses* tagged at least once:
    that dropped real nouns with several rarely tagged verb senses (``name``: 5 tagged noun senses but 7
    tagged verb senses, yet 104 noun tags against 55 verb tags; ``finger``: 1 against 2 senses, 53
    against 2 tags). The rule still keeps a lemma whose noun senses are tagged and which WordNet lists
    in no other part of speech (``a``: 13 noun tags, first sense the angstrom). Rule (b) only fires for
    frequent lemmas because a rare noun is often untagged merely because SemCor is small (a few hundred
    thousand words).

    Besides ``item_id``, ``text``, ``synset_offset``, ``gloss`` and :data:`PROPERTIES` (Float64), the
    table has ``noun_tag_count`` (Int64), the lemma's SemCor tags over all its noun senses; it is not a
    property.

    Raises ``FileNotFoundError`` naming the folder and file when a database file (``index.noun``,
    ``data.noun``, ``cntlist.rev``) is missing.
    """
    from wordfreq import zipf_frequency

    db_dir = Path(db_dir)
    tags = _parse_cntlist(require_file(db_dir, "cntlist.rev"))
    # Filter on any @i, not on is_instance: the five synsets with both @ and @i (Alabama, Isle of Wight,
    # Logrono, Orion, the Enlightenment) are proper names too, and NLTK counts them as instances.
    nouns = read_wordnet_nouns(db_dir).filter(
        ~pl.col("has_instance_hypernym") & pl.col("text").str.contains(f"^{_COMMON_TEXT.pattern}$")
    )
    per_pos = [tags.get(lemma, {}) for lemma in nouns["item_id"]]
    nouns = nouns.with_columns(
        zipf=pl.Series([zipf_frequency(t, "en") for t in nouns["text"]], dtype=pl.Float64),
        noun_tag_count=pl.Series([c.get("noun", 0) for c in per_pos], dtype=pl.Int64),
        other_tag_count=pl.Series(
            [max(c.get(pos, 0) for pos in _OTHER_POS) for c in per_pos], dtype=pl.Int64
        ),
    ).filter(pl.col("zipf") > 0)
    mostly_not_noun = pl.col("other_tag_count") > pl.col("noun_tag_count")
    function_word = (pl.col("noun_tag_count") == 0) & (pl.col("zipf") >= FUNCTION_WORD_ZIPF)
    out = nouns.filter(~(mostly_not_noun | function_word)).select(
        "item_id", "text", "synset_offset", "gloss",
        *[pl.col(p).cast(pl.Float64) for p in PROPERTIES],
        "noun_tag_count",
    ).sort(["zipf", "item_id"], descending=[True, False])
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out.write_parquet(out_path, compression="zstd", compression_level=19, statistics=False)
    return out_path


def load_wordnet_nouns() -> ProbeSet:
    """The shipped ``wordnet-nouns`` probe set: items in stable order (most frequent first) and the
    properties ``min_depth``, ``n_hypernym_paths``, ``n_direct_hyponyms``, ``n_all_hyponyms``,
    ``n_senses`` and ``zipf`` in long format."""
    ref = resources.files("pipeline.data") / DATA_FILE
    with resources.as_file(ref) as path:
        table = pl.read_parquet(path, columns=["item_id", "text", *PROPERTIES])
        origin = str(path)
    items = table.select(
        "item_id", "text", kind=pl.lit("word"), lang=pl.lit("en"), source=pl.lit(SOURCE)
    )
    properties = table.unpivot(
        index="item_id", on=list(PROPERTIES), variable_name="property", value_name="value"
    )
    return ProbeSet(name=PROBE_SET_NAME, items=items, properties=properties, origin=origin)
