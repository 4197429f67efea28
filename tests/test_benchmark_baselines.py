"""The pipeline-ceiling benchmark's baselines: each encodes exactly the rows it is given, in spawned processes."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from ceiling_baselines import KINDS, REPO, ParallelEncode  # noqa: E402


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("baselines") / "texts.parquet"
    pl.DataFrame({"text": [f"a photo of item number {i}." for i in range(3_000)]}).write_parquet(path)
    return str(path)


@pytest.mark.parametrize("kind", KINDS)
def test_each_baseline_encodes_the_rows_it_is_given_in_its_processes(kind, probes, tiny_model_dir, monkeypatch):
    import ceiling_baselines

    monkeypatch.setattr(ceiling_baselines, "SLICE", 700)  # several jobs per process, the last one short
    encode = ParallelEncode(REPO, str(tiny_model_dir), workers=2, threads=1, kind=kind)
    assert encode.seconds(probes, 100, 2_900) > 0  # it asserts the processes encoded 2,800 texts, no more, no less
    with pytest.raises(AssertionError, match="encoded 0 texts of 10"):
        encode.seconds(probes, 3_000, 3_010)  # past the file's end: nothing to encode, and it says so


def test_an_unknown_baseline_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="unknown baseline 'onnx'; one of embedder, sentence-transformers"):
        ParallelEncode(REPO, str(tiny_model_dir), 2, 1, "onnx")
