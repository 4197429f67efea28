"""Which sentence-transformers stacks the embedder runs itself, without importing the library."""

from __future__ import annotations

import json
from pathlib import Path

# Pooling config keys of sentence-transformers and the pooling this module computes for them itself.
_ST_POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}


def native_st_pooling(path) -> str | None:
    """The pooling of a sentence-transformers model whose modules this module runs without the library.

    That is the common stack, Transformer -> Pooling (CLS or mean, one mode) -> optional Normalize,
    with a cased tokenizer (``do_lower_case`` false): the transformer's last hidden state pooled
    exactly as sentence-transformers pools it (the tests compare with ``SentenceTransformer.encode``).
    Importing sentence-transformers costs seconds per worker process; any other stack (Dense layers,
    several or other pooling modes, prompts kept out of the pooling) returns None and is run by
    sentence-transformers itself.
    """
    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text())
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        bert_config = root / modules[0].get("path", "") / "sentence_bert_config.json"
        if bert_config.is_file() and json.loads(bert_config.read_text()).get("do_lower_case"):
            return None
        config = json.loads((root / modules[1].get("path", "") / "config.json").read_text())
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    on = {k for k, v in config.items() if k.startswith("pooling_mode_") and v}
    if config.get("pooling_mode") is not None or config.get("include_prompt") is False or len(on) != 1:
        return None
    return _ST_POOLING_MODES.get(on.pop())
