"""What an audit checks before Prefect or Dask start, so bad input fails in a second rather than a minute.

:func:`check_audit_inputs` resolves the model (registry name, directory or hub id: existence, layout,
``weights_sha256``, fingerprint) and loads and validates every probe set, in the CLI's own process. The
flow, which runs in the same process, resolves the model again from the in-process caches of
:mod:`pipeline.embedding.models` and :mod:`pipeline.embedding.hub` (no second hash of the weights, no second hub call).

It also looks at the texts with the model's own tokenizer (the ``tokenizers`` library only: no torch):
a text that becomes nothing but the unknown token (``[UNK]``) embeds exactly like every other such text,
so those items are counted and named in a warning, and a probe set made only of them stops the audit
before anything is embedded. Each text is judged on its first 256 characters; the built-in sets are not
checked (known text: it is the user's data that may be mis-encoded or in another script), and a
tokenizer without an unknown token (byte-level BPE) needs no check. ``normaudit probes add`` knows no
model yet; it runs the same count with the default model's tokenizer (:data:`DEFAULT_MODEL`, when
installed) and says which tokenizer it used.

Nothing here imports torch or transformers, Prefect or Dask. The probe readers are imported inside the
functions that use them: polars takes seconds to import, and a typo in the model spec fails first.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from pipeline.embedding.models import ResolvedModel, get_spec, model_dir, resolve_model, transformer_dir

if TYPE_CHECKING:  # polars and the probe readers load only after the model spec has been checked
    from pipeline.probes.base import ProbeSet

__all__ = ["DEFAULT_MODEL", "Preflight", "check_audit_inputs", "default_tokenizer_warning", "unknown_only_items"]

DEFAULT_MODEL = "minilm-l6"  # the model the README's examples audit
# A probe file (or stored set) larger than this is not loaded in the CLI's process: the flow runs there, and its
# memory must not grow with the items (a million template sentences, 7 MiB of Parquet, took it from 0.4 to 2.7 GiB
# loaded and tokenized). The worker that loads and gates the set runs the same checks (steps.prepare_probes): its
# errors come seconds later. Below this (~250,000 short sentences, or thousands of passages) they come at once.
PREFLIGHT_MAX_BYTES = 2 << 20


@dataclass
class Preflight:
    """What the pre-flight resolved, and what the CLI should tell the user before the audit starts."""

    resolved: ResolvedModel
    probe_sets: list[ProbeSet]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Vocabulary:
    tokenizer: object  # tokenizers.Tokenizer
    unk_id: int | None
    unk_token: str


def _vocabulary(path: str | Path) -> _Vocabulary | None:
    """The fast tokenizer of a model directory, without padding or truncation; ``None`` when it has no
    ``tokenizer.json`` or no unknown token (byte-level vocabularies spell every text)."""
    for d in dict.fromkeys((Path(path), transformer_dir(path))):
        file = d / "tokenizer.json"
        if file.is_file():
            break
    else:
        return None
    text = file.read_text(encoding="utf-8")
    model = json.loads(text).get("model", {})
    tok = Tokenizer.from_str(text)
    tok.no_padding()
    tok.no_truncation()
    unk_id = tok.token_to_id(model["unk_token"]) if model.get("unk_token") else model.get("unk_id")
    if unk_id is None:
        return None
    return _Vocabulary(tok, unk_id, tok.id_to_token(unk_id) or "[UNK]")


_HEAD_CHARS = 256
# Words looked up in the first round of unknown_only_items (then twice as many each round, up to _LAST_WORDS).
_FIRST_WORDS = 4096
_LAST_WORDS = 8 * _FIRST_WORDS  # four rounds at most: a set of rare or unknown words goes on to whole texts


def _head(text: str) -> str:
    # a text's first words decide it: one known token there and the text is not unknown-only, and tokenizing
    # whole documents would cost seconds per thousand; cut at whitespace so no word is cut into a known piece
    if len(text) <= _HEAD_CHARS:
        return text
    cut = max(text.rfind(c, 0, _HEAD_CHARS) for c in " \t\n")
    return text[:cut] if cut > 0 else text[:_HEAD_CHARS]


def unknown_only_items(ps: ProbeSet, vocab: _Vocabulary) -> list[str]:
    """Item ids whose text tokenizes (without special tokens) to nothing but the unknown token, or to nothing.

    Each text is judged on its first 256 characters (cut at whitespace). Its words (runs of non-whitespace) are
    looked at first, the most frequent first: a text with one word that is more than the unknown token on its own
    is not unknown-only (WordPiece and SentencePiece vocabularies split at whitespace before they look a word up),
    and only the texts left are tokenized whole. A few thousand frequent words settle nearly every text of a real
    set: a million template sentences cost ~0.1 s of tokenizing instead of ~17 CPU-seconds (measured).
    """
    import polars as pl

    heads = [_head(t) for t in ps.items["text"].to_list()]
    words = pl.DataFrame({"row": range(len(heads)), "word": heads}).with_columns(
        pl.col("word").str.extract_all(r"\S+")).explode("word").drop_nulls("word")
    looked_up: set[str] = set()
    spelled_rows: set[int] = set()
    batch = _FIRST_WORDS
    while words.height and batch <= _LAST_WORDS:
        frequent = (words.filter(~pl.col("word").is_in(pl.Series(list(looked_up), dtype=pl.String).implode()))
                    ["word"].value_counts(sort=True).head(batch)["word"].to_list())
        if not frequent:
            break
        looked_up.update(frequent)
        encoded = vocab.tokenizer.encode_batch(frequent, add_special_tokens=False)
        known = [w for w, e in zip(frequent, encoded, strict=True) if any(i != vocab.unk_id for i in e.ids)]
        spelled = words.filter(pl.col("word").is_in(pl.Series(known, dtype=pl.String).implode()))["row"].unique()
        spelled_rows.update(spelled.to_list())
        words = words.filter(~pl.col("row").is_in(spelled.implode()))
        batch *= 2  # rarer words: a few rounds, then the texts left are tokenized whole
    rows = [r for r in range(len(heads)) if r not in spelled_rows]  # no word of theirs is spelled: tokenize whole
    unique = list(dict.fromkeys(heads[r] for r in rows))
    encoded = vocab.tokenizer.encode_batch(unique, add_special_tokens=False)
    blank = {t for t, e in zip(unique, encoded, strict=True) if all(i == vocab.unk_id for i in e.ids)}
    ids = ps.items["item_id"].to_list()
    return [ids[r] for r in rows if heads[r] in blank]


def _unknown_message(ps: ProbeSet, ids: list[str], n: int, vocab: _Vocabulary, whose: str) -> str:
    return unknown_message(ps.name, ids[:6], len(ids), n, vocab.unk_token, whose)


def unknown_message(name: str, first_ids: list[str], count: int, n: int, unk_token: str, whose: str) -> str:
    """The unknown-token warning (or error, when ``count == n``) for ``count`` of ``n`` audited texts of probe set
    ``name``; ``first_ids``: the first ids found (five are shown)."""
    shown = f"item_id {first_ids[:5]}{' ...' if count > 5 else ''}"
    if count == n:
        return (f"probe set {name!r}: all {n} texts are nothing but the unknown token {unk_token} for "
                f"{whose} ({shown}): every item would embed alike, so there is nothing to measure; check the "
                "file's encoding and language, or audit with a model whose vocabulary covers them")
    return (f"probe set {name!r}: {count} of {n} texts are nothing but the unknown token "
            f"{unk_token} for {whose} ({shown}): they all embed alike and measure nothing; check the "
            "file's encoding and language, or drop those items")


def check_audit_inputs(settings, model: str, probes: list[str], limit: int | None = None,
                       replace: bool = False, say: Callable[[str, str], None] | None = None) -> Preflight:
    """Resolve the model and load every probe set but the built-in ones, raising before anything is started
    or written (a built-in name, or a template of one, is valid as given: it is shipped and tested data).

    Args:
        settings: the audit's settings (the root holds stored probe sets; probe files use its storage options).
        model: registry name, model directory or ``hf:ORG/NAME[@REV]``, as given to ``normaudit audit``.
        probes: probe set names or probe files.
        limit: only the first ``limit`` items of each set are audited (and checked for unknown tokens).
        replace: a probe file may replace a stored set of its name (``audit --replace``); without it such a
            file is refused here, as the flow would refuse it.
        say: called with ``("note" | "warning", message)`` as soon as each is known, so what was said about
            the sets loaded before a failing one is not lost.

    Returns:
        The resolved model, the loaded probe sets, notes (kinds that were inferred) and warnings (items
        that are only the unknown token).

    Raises:
        ModelNotFoundError, ModelIntegrityError: the model cannot be found, fetched or trusted.
        ProbeInputError: a probe set is unknown or invalid, a probe file would silently replace a stored
            set, or every text of a set is the unknown token.
    """
    from pipeline.probes import brings_file, load_probe_set
    from pipeline.probes.base import ProbeInputError
    from pipeline.probes.stored import refuse_silent_replace
    from pipeline.storage.store import open_store

    # cheapest first: the spec (a missing directory, a malformed hub id), then the probe sets, and only then
    # the weights' hash and any hub download, so that a typo never waits for either
    spec = get_spec(model)
    said: dict[str, list[str]] = {"note": [], "warning": []}

    def tell(level: str, message: str) -> None:
        said[level].append(message)
        if say is not None:
            say(level, message)

    store = open_store(settings)
    sets = []
    for name in probes:
        if _shipped(name):  # a built-in name (or template of one) is valid as given: the flow loads it
            continue
        size = checked_on_worker(name, settings, store)
        if size is not None:
            tell("note", f"{name}: {size / 2**20:.0f} MB, loaded and checked by the worker that embeds it")
            continue
        ps = load_probe_set(name, settings.storage_options(), store=store)
        if brings_file(name):  # the flow refuses this too, but only after Prefect and Dask have started
            refuse_silent_replace(store, ps, name, replace)
        for note in ps.notes:
            tell("note", f"{ps.name}: {note}")
        sets.append(ps)
    out = Preflight(resolve_model(spec), sets, said["note"], said["warning"])
    vocab = _vocabulary(out.resolved.path)
    for ps in sets if vocab is not None else []:
        audited = ps.head(limit)
        ids = unknown_only_items(audited, vocab)
        if ids:
            message = _unknown_message(audited, ids, audited.items.height, vocab, f"model {spec.name!r}")
            if len(ids) == audited.items.height:
                raise ProbeInputError(message)
            tell("warning", message)
    return out


def checked_on_worker(spec: str, settings, store) -> int | None:
    """The bytes of ``spec``'s probe file (or stored items) when over :data:`PREFLIGHT_MAX_BYTES`, else None:
    such a set is loaded and checked by a worker (:func:`unknown_token_warning`), never in the CLI's process."""
    import fsspec

    from pipeline.probes import brings_file
    from pipeline.probes.templates import split_template

    templated = split_template(spec)
    base = templated[0] if templated else spec
    try:
        if brings_file(spec):
            fs, path = fsspec.core.url_to_fs(base, **(settings.storage_options() if "://" in base else {}))
            size = fs.size(path)
        else:
            rel = f"{store.probes_dir(base)}/items.parquet"
            size = store.fs.size(store.path(rel)) if store.exists(rel) else None
    except (OSError, ValueError):  # missing or unreadable: the pre-flight's own load says so, with its message
        return None
    return size if size is not None and size > PREFLIGHT_MAX_BYTES else None


def unknown_token_warning(settings, resolved: ResolvedModel, ps: ProbeSet, spec: str,
                          limit: int | None = None) -> str | None:
    """On the worker, for a set the pre-flight left to it (:func:`checked_on_worker`): the unknown-token
    warning, or :class:`~pipeline.probes.base.ProbeInputError` when every audited text is the unknown token."""
    from pipeline.probes.base import ProbeInputError
    from pipeline.storage.store import open_store

    if _shipped(spec) or checked_on_worker(spec, settings, open_store(settings)) is None:
        return None
    vocab = _vocabulary(resolved.path)
    if vocab is None:
        return None
    audited = ps.head(limit)
    ids = unknown_only_items(audited, vocab)
    if not ids:
        return None
    message = _unknown_message(audited, ids, audited.items.height, vocab, f"model {resolved.spec.name!r}")
    if len(ids) == audited.items.height:
        raise ProbeInputError(message)
    return message


def unknown_in_block(resolved: ResolvedModel, ps: ProbeSet) -> tuple[list[str], str] | None:
    """For a block of a probe file prepared in blocks: the ids of its unknown-only items and the unknown token
    (``None`` when the model's vocabulary spells every text); :func:`unknown_message` words the sum."""
    vocab = _block_vocabulary(str(resolved.path))
    return None if vocab is None else (unknown_only_items(ps, vocab), vocab.unk_token)


@functools.lru_cache(maxsize=4)
def _block_vocabulary(path: str) -> _Vocabulary | None:
    # a worker prepares many blocks of one file with one model: its tokenizer is parsed once, not per block
    return _vocabulary(path)


def _shipped(spec: str) -> bool:
    from pipeline.probes import BUILTIN
    from pipeline.probes.templates import split_template

    templated = split_template(spec)
    return (templated[0] if templated else spec) in BUILTIN


def default_tokenizer_warning(ps: ProbeSet) -> str | None:
    """The unknown-token warning for ``ps`` with :data:`DEFAULT_MODEL`'s tokenizer, or ``None`` (no such
    items, or that model is not installed: ``normaudit audit`` checks again with the audited model)."""
    try:
        vocab = _vocabulary(model_dir(get_spec(DEFAULT_MODEL)))
    except LookupError:
        return None
    if vocab is None:
        return None
    ids = unknown_only_items(ps, vocab)
    if not ids:
        return None
    whose = f"the tokenizer of the default model {DEFAULT_MODEL!r} (an audit checks again with its own model)"
    return _unknown_message(ps, ids, ps.items.height, vocab, whose)
