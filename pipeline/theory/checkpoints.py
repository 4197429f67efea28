"""Lab checkpoints as model releases the normal audit pipeline loads, with no new loader code.

A checkpoint is written as a sentence-transformers directory:

    Transformer (an OPT model with zero decoder layers: token table lookup, nothing else)
    -> mean Pooling (one token per text, so the pooled vector is the table row)
    -> Dense(W1, tanh, no bias) -> Dense(W2, identity, no bias)     [encoder only]
    -> Normalize

OPT is used because, configured with ``do_layer_norm_before=False`` and no layers, its output is the raw
token embedding plus a learned position embedding (set to zero here): no LayerNorm that would erase the
very norm the audit measures. Each item's text is one word-level token, so the exported model maps world
item ``w00042`` to exactly the lab encoder's z_42 (up to float32 rounding), and ``token_norms`` of a
release are the table's row norms. ``trainer_state.json`` makes :func:`pipeline.embedding.models.get_spec` treat
the folder as a checkpoint: the model is named after the run folder and each step is a release.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

__all__ = ["export_checkpoint", "release_label"]

_SPECIALS = ["[PAD]", "[UNK]"]


def release_label(step: int) -> str:
    """The release label of a checkpoint: ``step-000500``."""
    return f"step-{step:06d}"


def _tokenizer(tokens: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*_SPECIALS, *tokens])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", model_max_length=8,
        # no token_type_ids: the OPT table model has no segment embedding to feed them to
        model_input_names=["input_ids", "attention_mask"],
    )


def _table_transformer(table, tokens: list[str], where: Path) -> None:
    """Save an OPT model whose only live weights are the item table (rows after the special tokens)."""
    import torch
    from transformers import OPTConfig, OPTModel

    n, dim = table.shape
    config = OPTConfig(
        vocab_size=n + len(_SPECIALS), hidden_size=dim, num_hidden_layers=0, ffn_dim=dim,
        num_attention_heads=1, max_position_embeddings=8, do_layer_norm_before=False,
        word_embed_proj_dim=dim, pad_token_id=0, bos_token_id=1, eos_token_id=1, dropout=0.0,
    )
    model = OPTModel(config)
    with torch.no_grad():
        weight = torch.zeros(n + len(_SPECIALS), dim)
        weight[len(_SPECIALS):] = table.detach().float()
        model.get_input_embeddings().weight.copy_(weight)
        model.decoder.embed_positions.weight.zero_()  # position carries no meaning for one-token texts
    model.save_pretrained(where, safe_serialization=True)
    _tokenizer(tokens).save_pretrained(where)


def export_checkpoint(model, tokens: list[str], out_dir: str | Path, step: int) -> Path:
    """Write ``model`` (a lab table or encoder) as a sentence-transformers release folder.

    Args:
        model: the lab's module (attribute ``table``; ``w1``/``w2`` for the encoder).
        tokens: the world's item tokens, in item order.
        out_dir: the run folder; the checkpoint goes to ``out_dir/step-XXXXXX``.
        step: training step of the checkpoint.
    Returns:
        The checkpoint folder.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as hf_logging

    try:  # sentence-transformers >= 6 moved the modules; the old path still works there, with a warning
        from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
    except ImportError:  # pragma: no cover - sentence-transformers 3-5
        from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    target = Path(out_dir) / release_label(step)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one-shard save bars are noise in the lab's log
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _table_transformer(model.table, tokens, Path(tmp))
            first = Transformer(tmp, max_seq_length=8)
            modules = [first, Pooling(model.table.shape[1], pooling_mode="mean")]
            for layer, act in ((getattr(model, "w1", None), torch.nn.Tanh()),
                               (getattr(model, "w2", None), torch.nn.Identity())):
                if layer is None:
                    continue
                dense = Dense(layer.in_features, layer.out_features, bias=False, activation_function=act)
                with torch.no_grad():
                    dense.linear.weight.copy_(layer.weight.detach().float())
                modules.append(dense)
            modules.append(Normalize())
            if target.exists():
                shutil.rmtree(target)
            SentenceTransformer(modules=modules, device="cpu").save(str(target))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (target / "trainer_state.json").write_text(json.dumps({"global_step": step}) + "\n")
    return target
