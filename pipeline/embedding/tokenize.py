"""Texts to :class:`~pipeline.embedding.batching.Tokens`: the fast tokenizer's Rust backend in one batch call.

:class:`TextTokenizer` keeps a private copy of the model's Rust tokenizer (truncation at ``max_length`` on,
padding off) and turns a chunk of texts into flat id arrays. The Rust side encodes the whole chunk on all
cores with the GIL released (``encode_batch_fast``: no character offsets, which nothing here reads; plain
``encode_batch`` on tokenizers releases that lack it). What stays in Python is one ``.ids`` list per text and
one flattening pass over all of them (``Tokens.from_lists``); type ids are read only where a tokenizer gives
a single text non-zero ones, and overflow (truncation) only for texts cut to exactly ``max_length``.
Tokenizers without a Rust backend go through the slow ``transformers`` tokenizer call.

Measured (``benchmarks/embed_throughput.py --tokenize-only``, MiniLM, 2-core Xeon): the Python part is a few
percent of tokenization on words and passages; the Rust encode is the rest. ``Encoding.merge`` (one ids
list for the whole chunk) was tried and is slower (it copies every encoding, and multiplies overflowing
pieces: 20 GB for 2,000 passages), so the per-text lists stay.
"""

from __future__ import annotations

import numpy as np

from pipeline.embedding.batching import Tokens

__all__ = ["TextTokenizer"]


class TextTokenizer:
    """Tokenizes chunks of texts for one model: truncated to ``max_length``, with special tokens.

    ``tokenizer`` is the model's ``transformers`` tokenizer; it is never reconfigured (its Rust backend is
    copied). :attr:`types_needed` tells whether type ids vary per text (else all 0 and never read).
    """

    def __init__(self, tokenizer, max_length: int) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.backend = self._make_backend()
        self._encode = None
        if self.backend is not None:
            # documented batch path without offsets; older tokenizers releases only have encode_batch
            self._encode = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        self.with_types = "token_type_ids" in tokenizer.model_input_names
        self.types_needed = self.with_types and not self._single_text_types_are_zero()

    def _make_backend(self):
        """A private copy of the fast tokenizer's Rust backend: truncation on, padding off.

        A copy, because tokenizer.json files often carry their own fixed padding/truncation (MiniLM's
        pads to 128) and the shared HF tokenizer object must not be reconfigured under its users.
        """
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        from tokenizers import Tokenizer  # with transformers: loaded already wherever a backend exists

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_padding()
        copy.enable_truncation(max_length=self.max_length, strategy="longest_first", stride=0)
        return copy

    def _single_text_types_are_zero(self) -> bool:
        """Whether one text's type ids are all 0, so they need not be read per text.

        A post-processor gives a single sequence's type ids by template position ([CLS], text, [SEP]),
        never by the text's content, so one probe text tells for all.
        """
        probe = "a b 1"
        if self.backend is not None:
            return not any(self.backend.encode(probe, add_special_tokens=True).type_ids)
        return not any(self._tokenizer(probe, add_special_tokens=True).get("token_type_ids") or [])

    def __call__(self, texts: list[str]) -> Tokens:
        """Token ids (truncated, with special tokens), type ids where not all 0, and a truncation flag per text."""
        if self.backend is not None:
            encs = self._encode(texts, add_special_tokens=True)
            types = [e.type_ids for e in encs] if self.types_needed else None
            tokens = Tokens.from_lists([e.ids for e in encs], types)
            # Overflow pieces exist exactly when the text had more than max_length tokens, and a truncated
            # text has max_length tokens left: only those are asked (each .overflowing builds objects).
            for i in np.flatnonzero(tokens.lengths >= self.max_length):
                tokens.truncated[i] = bool(encs[i].overflowing)
            return tokens
        tok = self._tokenizer
        full = tok(texts, truncation=False, add_special_tokens=True)["input_ids"]
        enc = tok(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)
        tokens = Tokens.from_lists(enc["input_ids"], enc.get("token_type_ids") if self.types_needed else None)
        tokens.truncated[:] = [len(f) > self.max_length for f in full]
        return tokens
