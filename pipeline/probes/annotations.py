"""Annotator distributions: NLI items labelled by many people, with the entropy of their labels.

The layout is ChaosNLI's (``../shared/data/chaosnli``, JSON lines): ``uid``, per-label counts
(``label_counter`` ``{"e": 30, "n": 70}`` or ``label_count`` ``[30, 70, 0]``) and
``example.premise`` / ``example.hypothesis``.

Each line becomes three items that share the line's uid:

==================  ==========  =====================================================
item_id             kind        text
==================  ==========  =====================================================
``pair:<uid>``      ``pair``    premise, a space, hypothesis (one text for a bi-encoder)
``premise:<uid>``   ``sentence`` the premise
``hypothesis:<uid>`` ``sentence`` the hypothesis
==================  ==========  =====================================================

All three carry ``label_entropy`` (Shannon entropy of the label counts, in bits, as ChaosNLI's own
``entropy`` field), so the norm of each can be set against the disagreement about the pair. Relations
tie them together: ``(premise:<uid>, pair:<uid>, 'premise_of')`` and ``(hypothesis:<uid>, pair:<uid>,
'hypothesis_of')``, value null. Since premise and hypothesis share kind ``sentence``, SQL tells them apart
by the id prefix (``split_part(item_id, ':', 1)``) or through the relations. Items come line by line
(pair, premise, hypothesis), so ``--limit N`` embeds whole triples.

Licence: ChaosNLI is CC BY-NC 4.0; it is read from the user's copy and never shipped.
"""

from __future__ import annotations

import math

import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.probes.files import jsonl_records, read_text

LABEL_ENTROPY = "label_entropy"


def label_entropy(counts: list[float]) -> float:
    """Entropy in bits of the label distribution given by ``counts``."""
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c > 0) + 0.0


def _text(obj: dict, key: str, url: str, line: int) -> str:
    example = obj.get("example")
    value = example.get(key) if isinstance(example, dict) else None
    if not isinstance(value, str):
        hint = " (αNLI lines have obs1/hyp1 instead: only premise/hypothesis data is read)" if value is None \
            else ""
        raise ProbeInputError(f"{url}: line {line}: field 'example.{key}' is missing or not text{hint}.")
    if not value.strip():
        raise ProbeInputError(f"{url}: line {line}: empty text in 'example.{key}'.")
    return value.strip()


def _counts(obj: dict, url: str, line: int) -> list[float]:
    raw = obj.get("label_counter", obj.get("label_count"))
    values = list(raw.values()) if isinstance(raw, dict) else raw
    if not isinstance(values, list) or not values:
        raise ProbeInputError(f"{url}: line {line}: missing 'label_counter' (or 'label_count') with the "
                              "per-label annotator counts.")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in values) or sum(values) <= 0:
        raise ProbeInputError(f"{url}: line {line}: label counts {raw!r} must be non-negative numbers, "
                              "not all zero.")
    return [float(v) for v in values]


def read_label_distributions(url: str, name: str, storage_options: dict | None = None,
                             lang: str = "en") -> ProbeSet:
    """A ChaosNLI-style JSONL file as a probe set of pairs, premises and hypotheses with ``label_entropy``.

    Raises:
        ProbeInputError: naming the file and line (broken JSON, missing uid/premise/hypothesis/counts,
            empty text, bad counts, a uid listed twice).
    """
    if not url.split("?")[0].lower().endswith((".jsonl", ".ndjson")):
        raise ProbeInputError(
            f"{url}: annotator distributions are read from ChaosNLI-style JSON lines (.jsonl)."
        )
    ids, texts, kinds, entropies, relations = [], [], [], [], []
    seen: dict[str, int] = {}
    for line, obj in jsonl_records(read_text(url, storage_options), url):
        uid = obj.get("uid")
        if not isinstance(uid, (str, int)) or isinstance(uid, bool) or not str(uid).strip():
            raise ProbeInputError(f"{url}: line {line}: field 'uid' is missing or empty.")
        uid = str(uid)
        if uid in seen:
            raise ProbeInputError(
                f"{url}: line {line}: uid {uid!r} is listed twice (first at line {seen[uid]})."
            )
        seen[uid] = line
        premise, hypothesis = _text(obj, "premise", url, line), _text(obj, "hypothesis", url, line)
        h = label_entropy(_counts(obj, url, line))
        ids += [f"pair:{uid}", f"premise:{uid}", f"hypothesis:{uid}"]
        texts += [f"{premise} {hypothesis}", premise, hypothesis]
        kinds += ["pair", "sentence", "sentence"]
        entropies += [h, h, h]
        relations += [(f"premise:{uid}", f"pair:{uid}", "premise_of"),
                      (f"hypothesis:{uid}", f"pair:{uid}", "hypothesis_of")]
    if not ids:
        raise ProbeInputError(f"{url}: no rows.")
    items = pl.DataFrame({"item_id": ids, "text": texts, "kind": kinds, "lang": lang, "source": url})
    properties = pl.DataFrame({"item_id": ids, "property": LABEL_ENTROPY, "value": entropies})
    rel = pl.DataFrame(relations, schema={"left_id": pl.String, "right_id": pl.String, "relation": pl.String},
                       orient="row").with_columns(value=pl.lit(None, dtype=pl.Float64))
    return ProbeSet(name=name, items=items, properties=properties, relations=rel, origin=url)
