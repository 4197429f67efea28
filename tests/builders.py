"""A deterministic tiny BERT for tests: built locally in about a second, never downloaded.

:func:`build_tiny_model` writes either a sentence-transformers directory (same layout as
all-MiniLM-L6-v2: Transformer -> mean Pooling -> Normalize) or a plain transformers directory,
so tests exercise the very code paths the real models take. :func:`build_random_like` gives a
real model's architecture and tokenizer random weights, for GPU checks on machines that cannot
receive the real weights (speed does not depend on weight values; the vectors do).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Literal

__all__ = ["TINY_WORDS", "build_random_like", "build_tiny_model"]

# A fixed English word list: the tokenizer is trained on it, so it must never change order or content
# (the vocabulary, and through it the weight shapes and fingerprint, depend on it).
_WORD_TEXT = """
    the of and to in is was he for it with as his on be at by had are but from or have an they which one
    you were her all she there would their we him been has when who will more no if out so said what up
    its about into than them can only other new some could time these two may then do first any my now
    such like our over man me even most made after also did many before must through back years where
    much your way well down should because each just those people how too little state good very make
    world still own see men work long get here between both life being under never day same another know
    while last might us great old year off come since against go came right used take three states
    himself few house use during without again place american around however home small found thought
    went say part once general high upon school every don does got united left number course war until
    always away something fact though water less public put think almost hand enough far took head yet
    government system better set told nothing night end why called didn eyes find going look asked later
    knew point next city business give group toward young let room president side social given present
    several order national possible rather second face per among form important often things looked early
    white john case become large big need four within felt along children saw best church ever least power
    development light thing seemed family interest want members mind country area others done turned
    although open god service certain kind problem began different door thus help sense means whole matter
    perhaps itself york times human law line above name example action company hands local show whether
    five history gave today either act feet across taken past quite anything seen having death week body
    word half really field car words already themselves information tell together college shall money
    period held keep sure free seems political real behind cannot miss question air office making brought
    whose special major heard problems ago became federal study available known result street economic
    boy position reason change south board individual job areas society west close turn love community
    true court force full seem am front woman care sound music dog cat tree river stone bread horse bird
    apple table chair window garden mountain ocean winter summer doctor animal flower
"""
TINY_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_SUFFIXES = ["##s", "##es", "##ed", "##ing", "##er", "##ly", "##est", "##ment", "##ness", "##tion"]
_HIDDEN, _LAYERS, _HEADS, _INTERMEDIATE = 32, 2, 2, 64


def _train_tokenizer(max_length: int):
    """A lower-casing BERT WordPiece tokenizer whose vocabulary is derived from :data:`TINY_WORDS`.

    The vocabulary is assembled in a fixed order rather than learned with ``WordPieceTrainer``: the
    trainer breaks ties between equally frequent pairs in hash order, which differs between processes,
    and tests need the same token ids on every run. Unknown words still split into ``##`` pieces.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    alphabet = sorted(set("".join(TINY_WORDS)) | set(string.ascii_lowercase + string.digits))
    punctuation = list(".,;:!?'\"-()")
    vocab: dict[str, int] = {}
    pieces = [*_SPECIALS, *alphabet, *punctuation, *(f"##{c}" for c in alphabet), *_SUFFIXES, *TINY_WORDS]
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, clean_text=True, handle_chinese_chars=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return BertTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        do_lower_case=True,
        model_max_length=max_length,
    )


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_tiny_model(
    out_dir,
    kind: Literal["sentence-transformers", "transformers"] = "sentence-transformers",
    seed: int = 0,
    max_length: int = 32,
) -> Path:
    """Build a tiny random BERT (hidden 32, 2 layers, 2 heads) with its tokenizer into ``out_dir``.

    ``kind="sentence-transformers"`` adds ``modules.json``, ``sentence_bert_config.json``,
    ``1_Pooling/config.json`` (mean pooling) and ``2_Normalize``, the all-MiniLM-L6-v2 layout.
    The same ``seed`` gives byte-identical weight files, hence the same fingerprint.
    Returns the directory as a :class:`~pathlib.Path`.
    """
    if kind not in ("sentence-transformers", "transformers"):
        raise ValueError(f"kind must be 'sentence-transformers' or 'transformers', not {kind!r}")
    if max_length < 4:
        raise ValueError(f"max_length must be at least 4 (room for [CLS], [SEP] and text), not {max_length}")
    import torch
    from transformers import BertConfig, BertModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(max_length)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=_HIDDEN,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        intermediate_size=_INTERMEDIATE,
        max_position_embeddings=max(64, max_length),
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
        # A wider init than BERT's 0.02 so token and sentence norms actually vary in tests.
        initializer_range=0.2,
    )
    # Fork the RNG so building a model never perturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertModel(config)
    model.eval()
    _save_quietly(model, out)
    tokenizer.save_pretrained(out)
    if kind == "sentence-transformers":
        _write_json(
            out / "modules.json",
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ],
        )
        _write_json(out / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
        _write_json(
            out / "1_Pooling" / "config.json",
            {
                "word_embedding_dimension": _HIDDEN,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
        )
        (out / "2_Normalize").mkdir(exist_ok=True)
    return out


def build_random_like(src_dir, out_dir, seed: int = 0) -> Path:
    """Copy a model directory without its weights and save random weights of the same architecture.

    Everything but weight files (config, tokenizer, sentence-transformers modules) is copied from
    ``src_dir``; the transformer is built from its ``config.json`` with transformers' own random
    initialisation (``seed``) and saved as ``model.safetensors`` in float32, so the result loads
    through the same resolve/Embedder path as the original. Vectors are meaningless; shapes, FLOPs
    and therefore throughput are the original's. Returns ``out_dir`` as a :class:`~pathlib.Path`.
    """
    import shutil

    import torch
    from transformers import AutoConfig, AutoModel

    from pipeline.embedding.models import WEIGHT_SUFFIXES, transformer_dir

    src, out = Path(src_dir), Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} exists; pass a new directory")
    shutil.copytree(src, out, ignore=lambda _, names: [n for n in names if n.endswith(WEIGHT_SUFFIXES)])
    model_dir = transformer_dir(out)
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModel.from_config(config).to(torch.float32).eval()
    _save_quietly(model, model_dir)
    return out


def _save_quietly(model, path: Path) -> None:
    """``model.save_pretrained(path)`` as safetensors, without transformers' progress bar."""
    from transformers.utils import logging as hf_logging

    # A one-shard progress bar is noise in test output; restore the caller's setting afterwards.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(path, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
