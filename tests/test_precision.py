"""``--precision``: the forward pass in bfloat16/float16, recorded as its own measurement and refused where the
device cannot run it (issue 19).

bfloat16 on the CPU needs bfloat16 instructions (avx512_bf16/amx_bf16, Arm bf16): the tests that embed in it
skip on CPUs without them. The tiny local model throughout; the audit runs the installed CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipeline.audit.steps import embedding_params
from pipeline.embedding.embed import Embedder
from pipeline.embedding.models import get_spec, resolve_model
from pipeline.embedding.precision import (
    UnsupportedPrecision,
    check_precision,
    cpu_bf16_instructions,
    default_release,
    refuse_mixed_release,
)
from pipeline.settings import load_settings
from pipeline.storage.shards import split_shards
from pipeline.storage.store import Manifest, Store
from tests.builders import TINY_WORDS

BIN = Path(sys.executable).parent
needs_bf16 = pytest.mark.skipif(cpu_bf16_instructions() is False, reason="this CPU has no bfloat16 instructions")
# Largest relative error of a norm, bfloat16 vs float32: MiniLM on 20,000 words measured 6.8e-3 (2-core Xeon,
# AMX; benchmarks/embed_throughput.py), the tiny model 1.8e-3 (its Dense stack 2.8e-3) on the texts below.
NORM_BOUND = 1e-2
VECTOR_BOUND = 3e-2  # |v_bf16 - v_fp32| / |v_fp32|: the tiny model measured 1.2e-2


def _texts(n: int = 120, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(TINY_WORDS[j] for j in rng.integers(0, len(TINY_WORDS), size=int(rng.integers(1, 40))))
            for _ in range(n)]


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """The installed ``normaudit`` as a user runs it: no harness API, its own temporary one."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["NORMAUDIT_SHARD_SIZE"] = "8"
    return subprocess.run([str(BIN / "normaudit"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich/typer may wrap long lines


def test_cpu_refuses_float16_naming_what_to_use():
    with pytest.raises(UnsupportedPrecision, match="float16 on the CPU") as err:
        check_precision("cpu", "float16")
    assert "bfloat16" in str(err.value) and "float32" in str(err.value)
    check_precision("cpu", "float32")
    with pytest.raises(UnsupportedPrecision, match="not one of"):
        check_precision("cpu", "int8")


def test_cpu_bf16_instructions_are_read_from_cpuinfo(tmp_path):
    with_amx, without = tmp_path / "amx", tmp_path / "plain"
    with_amx.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f amx_bf16 amx_tile\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert cpu_bf16_instructions(with_amx) is True
    assert cpu_bf16_instructions(without) is False
    assert cpu_bf16_instructions(tmp_path / "absent") is None


def test_default_release_keeps_float32_labels():
    fp = "3a6f58140466d03fd5aefdeef514a0ef2479387afc13fae0a0da6feca80d1c00"
    assert default_release(fp, "float32") == "3a6f58140466"
    assert default_release(fp, "bfloat16") == "3a6f58140466-bfloat16"


def test_shard_hashes_differ_by_precision_and_float32_keeps_its_own(tiny_model_dir):
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    items = pl.DataFrame({"item_id": [f"w{i}" for i in range(10)], "text": list(TINY_WORDS[:10])})
    ids = {}
    for precision in ("float32", "bfloat16", "float16"):
        params = embedding_params(resolved, load_settings(precision=precision))
        ids[precision] = [s.shard_id for s in split_shards("words", items, resolved.fingerprint, params, 4)]
    assert len({tuple(v) for v in ids.values()}) == 3
    # float32 adds nothing to the params: shards committed before precision existed keep their ids
    assert "precision" not in embedding_params(resolved, load_settings())
    assert embedding_params(resolved, load_settings(precision="bfloat16"))["precision"] == "bfloat16"


def test_mixed_release_is_refused_naming_both_precisions():
    old = Manifest(model="m", release="r1", probe_set="words", fingerprint="f", params={}, dim=4,
                   vector_dtype="float32")
    # written before precision was recorded: float32
    assert Manifest.from_json(json.dumps({k: v for k, v in json.loads(old.to_json()).items()
                                          if k != "precision"}).encode()).precision == "float32"
    refuse_mixed_release([old], "m", "r1", "float32")
    with pytest.raises(ValueError, match="release 'r1' of 'm' already holds float32 embeddings") as err:
        refuse_mixed_release([old], "m", "r1", "bfloat16")
    assert "--release r1-bfloat16" in str(err.value) and "normaudit compare" in str(err.value)


@needs_bf16
def test_bf16_vectors_are_close_to_fp32_and_pooled_in_float32(tiny_model_dir):
    import torch

    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    texts = _texts()
    fp32 = Embedder(resolved, device="cpu").embed(texts)
    emb = Embedder(resolved, device="cpu", precision="bfloat16")
    bf16 = emb.embed(texts)
    assert next(emb.model.parameters()).dtype == torch.bfloat16
    assert bf16.vectors.dtype == np.float32 and bf16.norms.dtype == np.float64
    # the norm is the float32 raw vector's, taken in float64 (not a bfloat16 norm)
    np.testing.assert_allclose(np.linalg.norm(bf16.vectors.astype(np.float64), axis=1), bf16.norms, rtol=1e-6)
    rel = np.abs(bf16.norms / fp32.norms - 1)
    assert 0 < rel.max() < NORM_BOUND  # different (it did run in bfloat16), and close
    assert (np.linalg.norm(bf16.vectors - fp32.vectors, axis=1) / fp32.norms).max() < VECTOR_BOUND
    np.testing.assert_array_equal(bf16.n_tokens, fp32.n_tokens)


@needs_bf16
def test_bf16_st_stack_runs_later_modules_in_float32(tmp_path, tiny_model_dir):
    """A sentence-transformers stack run by the library: only its Transformer is cast; Dense stays float32."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize

    st = SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)
    torch.manual_seed(0)
    SentenceTransformer(modules=[*list(st)[:2], Dense(32, 16), Normalize()], device="cpu").save(str(tmp_path / "d"))
    resolved = resolve_model(get_spec(str(tmp_path / "d")))
    texts = _texts(seed=1)
    emb = Embedder(resolved, device="cpu", precision="bfloat16")
    assert emb.pooling == "st"
    bf16, fp32 = emb.embed(texts), Embedder(resolved, device="cpu").embed(texts)
    dense = [m for m in emb._st_modules if type(m).__name__ == "Dense"][0]
    assert next(dense.parameters()).dtype == torch.float32
    assert next(emb.model.parameters()).dtype == torch.bfloat16
    assert 0 < np.abs(bf16.norms / fp32.norms - 1).max() < NORM_BOUND


def test_cli_refuses_a_precision_the_device_cannot_run(tmp_path, tiny_model_dir):
    csv = tmp_path / "words.csv"
    pl.DataFrame({"item_id": ["a", "b"], "text": ["dog", "cat"]}).write_csv(csv)
    out = _cli("audit", "--model", str(tiny_model_dir), "--probes", str(csv), "--root", str(tmp_path / "root"),
               "--device", "cpu", "--precision", "float16", timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    err = _flat(out.stderr)
    assert "error: --precision float16 on the CPU" in err and "Use --precision bfloat16" in err, err
    assert not (tmp_path / "root" / "runs").exists()  # refused before anything ran
    bad = _cli("audit", "--model", str(tiny_model_dir), "--probes", str(csv), "--root", str(tmp_path / "root"),
               "--precision", "fp8", timeout=120)
    assert bad.returncode == 1 and "precision" in _flat(bad.stderr) and "bfloat16" in _flat(bad.stderr)


@needs_bf16
@pytest.mark.slow
def test_bf16_audit_records_its_precision_and_keeps_its_own_release(tmp_path, tiny_model_dir):
    """A bfloat16 audit (installed CLI) lands in ``<fingerprint12>-bfloat16``; its manifest and run row say
    bfloat16; a float32 audit into that release is refused, naming the release and both precisions."""
    csv = tmp_path / "words.csv"
    pl.DataFrame({"item_id": [f"w{i:02d}" for i in range(20)], "text": list(TINY_WORDS[:20]),
                  "zipf": [1.0 + i % 5 for i in range(20)]}).write_csv(csv)
    root = str(tmp_path / "root")
    audit = ["audit", "--model", str(tiny_model_dir), "--probes", str(csv), "--root", root, "--workers", "1"]
    done = _cli(*audit, "--precision", "bfloat16")
    assert done.returncode == 0, done.stdout + done.stderr
    label = default_release(resolve_model(get_spec(str(tiny_model_dir))).fingerprint, "bfloat16")
    store = Store(root)
    manifest = store.read_manifest("tiny", label, "words")
    assert manifest is not None, store.glob("embeddings/*/*/*/*")
    assert manifest.precision == "bfloat16" and manifest.params["precision"] == "bfloat16"
    runs = pl.concat([pl.read_parquet(store.path(p)) for p in store.glob("runs/*.parquet")])
    assert runs["release"].to_list() == [label] and runs["status"].to_list() == ["completed"]
    assert json.loads(runs["params"].item())["precision"] == "bfloat16"

    refused = _cli(*audit, "--release", label, timeout=120)  # float32, the default
    assert refused.returncode == 1, refused.stdout + refused.stderr
    err = _flat(refused.stderr)
    assert f"release {label!r} of 'tiny' already holds bfloat16 embeddings" in err, err
    assert "a float32 audit cannot add to it" in err and f"--release {label}-float32" in err
    assert len(store.glob("runs/*.parquet")) == 1  # refused before a run started
