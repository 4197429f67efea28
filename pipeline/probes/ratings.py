"""Rating norms: words rated by many people, with the mean and the spread of their ratings.

The layout is that of Brysbaert, Warriner & Kuperman (2014) concreteness norms
(``../shared/data/brysbaert_concreteness``): one row per word with its mean rating, the standard
deviation across raters (per-item human disagreement) and rater counts. Columns are found by name:

=============  =====================================  ==================================================
property       column (first one present)             note
=============  =====================================  ==================================================
(item text)    ``word``, ``Word``                     item id = the word
``rating_mean`` ``mean``, ``Conc.M``
``rating_sd``  ``sd``, ``SD``, ``Conc.SD``
``n_raters``   ``n_raters``, or ``Total`` - ``Unknown``  raters who rated the word (Brysbaert: raters who
                                                      did not know the word gave no rating)
``zipf``       (wordfreq)                             single words that wordfreq knows
=============  =====================================  ==================================================

Two-word expressions (``Bigram`` = 1, or any text with a space) are skipped: this family is word
probes, and wordfreq would score a phrase by its rarest word. Norms in another layout load through
``normaudit probes add NAME --from FILE --kind word --text COL --property rating_mean=COL ...``.

Licence: the Brysbaert norms are not redistributable (CC BY-NC-ND 3.0 as listed), so nothing of them
ships with the project; :data:`BRYSBAERT` reads a copy the user has.
"""

from __future__ import annotations

import polars as pl

from pipeline.probes.base import ProbeInputError, ProbeSet
from pipeline.probes.files import Columns, read_columns
from pipeline.probes.frequency import with_zipf

BRYSBAERT = "brysbaert-concreteness"
ALIASES = {
    "word": ("word", "Word"),
    "rating_mean": ("mean", "Conc.M"),
    "rating_sd": ("sd", "SD", "Conc.SD"),
}


def _pick(cols: Columns, role: str) -> str:
    for c in ALIASES[role]:
        if c in cols.values:
            return c
    raise ProbeInputError(
        f"{cols.url}: missing column for {role!r}: none of {list(ALIASES[role])} is present "
        f"(columns present: {cols.names}); rating norms need word, mean and SD columns."
    )


def _n_raters(cols: Columns) -> list[float | None] | None:
    if "n_raters" in cols.values:
        return cols.numbers("n_raters")
    if "Total" in cols.values and "Unknown" in cols.values:
        return [None if t is None or u is None else t - u
                for t, u in zip(cols.numbers("Total"), cols.numbers("Unknown"), strict=True)]
    return None


def read_rating_norms(url: str, name: str = BRYSBAERT, storage_options: dict | None = None,
                      lang: str = "en") -> ProbeSet:
    """A rating-norms file (CSV, TSV, JSONL or Parquet) as a word probe set with rating properties.

    Raises:
        ProbeInputError: naming the file and the column or line at fault (a missing column, a mean or SD
            that is not a number, a negative SD, a word listed twice, an empty word).
    """
    cols = read_columns(url, storage_options)
    words = cols.strings(_pick(cols, "word"), "word")
    means = cols.numbers(_pick(cols, "rating_mean"))
    sds = cols.numbers(_pick(cols, "rating_sd"))
    n_raters = _n_raters(cols)
    bigram = cols.numbers("Bigram") if "Bigram" in cols.values else [None] * len(words)
    seen: dict[str, int] = {}
    rows = []
    for i, w in enumerate(words):
        w = (w or "").strip()
        if not w:
            raise ProbeInputError(f"{url}: empty word at {cols.where(i)}; remove the row or give it a word.")
        if bigram[i] == 1 or " " in w:
            continue
        if w in seen:
            raise ProbeInputError(f"{url}: word {w!r} at {cols.where(i)} is listed twice (first at "
                                  f"{cols.where(seen[w])}); ids must be unique.")
        seen[w] = i
        if means[i] is None or sds[i] is None:
            raise ProbeInputError(f"{url}: word {w!r} at {cols.where(i)} has no mean or SD.")
        if sds[i] < 0:
            raise ProbeInputError(f"{url}: word {w!r} at {cols.where(i)} has a negative SD ({sds[i]}).")
        rows.append((w, means[i], sds[i], None if n_raters is None else n_raters[i]))
    if not rows:
        raise ProbeInputError(f"{url}: no single-word rows.")
    ids = [r[0] for r in rows]
    items = pl.DataFrame({"item_id": ids, "text": ids, "kind": "word", "lang": lang, "source": url})
    props = [
        pl.DataFrame({"item_id": ids, "property": p,
                      "value": pl.Series([r[k] for r in rows], dtype=pl.Float64)})
        for k, p in ((1, "rating_mean"), (2, "rating_sd"), (3, "n_raters"))
    ]
    properties = pl.concat(props).filter(pl.col("value").is_not_null())
    return with_zipf(ProbeSet(name=name, items=items, properties=properties, origin=url))
