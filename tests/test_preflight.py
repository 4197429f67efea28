"""Bad audit input fails in seconds, before Prefect or Dask start, with one line naming the input.

The installed CLI runs in a subprocess as a user runs it (no ``PREFECT_API_URL``, an empty hub cache); its
child processes are watched while it runs, since the temporary Prefect API and the local Dask workers
would be children of it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.requirements import need_minilm

CLI = str(Path(sys.executable).parent / "normaudit")
FAST_S = 3.0  # the promise, on a machine with a core to spare (about 1 s measured there)


def _budget() -> float:
    """FAST_S, stretched by how oversubscribed the CPUs are (a shared CI box); the old code took 47-70 s idle."""
    return FAST_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # an empty hub cache and Prefect home: nothing from this machine's caches can make a case pass
    return {**env, "HF_HOME": str(tmp_path / "hf"), "PREFECT_HOME": str(tmp_path / "prefect"), **extra}


def _run_watched(args: list[str], env: dict, timeout: float = 120) -> tuple[int, str, float, set[str]]:
    """(exit code, stderr, wall seconds, command lines of every child process seen while it ran)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent, children = psutil.Process(proc.pid), set()
    while proc.poll() is None and time.perf_counter() - t0 < timeout:
        with contextlib.suppress(psutil.Error):  # a child (or the CLI) exited between listing and reading it
            children |= {" ".join(c.cmdline()) for c in parent.children(recursive=True)}
        time.sleep(0.01)
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate()
    return proc.returncode, err, time.perf_counter() - t0, children


def _assert_fast_clean_failure(rc: int, err: str, wall: float, children: set[str], *named: str) -> None:
    assert rc == 1, err
    assert wall <= _budget(), f"took {wall:.1f} s (load {os.getloadavg()[0]:.1f}): {err}"
    assert not children, f"started {children}"  # neither the temporary API nor a Dask worker
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    # one error line, last; before it at most notes on what was inferred for sets that did load
    assert lines and lines[-1].startswith("error: "), err
    assert all(line.startswith("note: ") for line in lines[:-1]), err
    for text in named:
        assert text in lines[-1], err


def test_missing_model_directory_fails_in_seconds_naming_it(tmp_path):
    rc, err, wall, children = _run_watched(
        ["audit", "--model", "/nonexistent", "--probes", "wordnet-nouns", "--root", str(tmp_path / "root")],
        _env(tmp_path))
    _assert_fast_clean_failure(rc, err, wall, children, "'/nonexistent'", "does not exist")
    assert not list((tmp_path / "root").rglob("*.parquet"))  # no run record, no probe set: nothing written


def test_hub_model_offline_names_the_model_and_the_missing_hub(tmp_path):
    rc, err, wall, children = _run_watched(
        ["audit", "--model", "hf:does-not/exist", "--probes", "wordnet-nouns", "--root", str(tmp_path / "root")],
        _env(tmp_path, HF_HUB_OFFLINE="1"))
    _assert_fast_clean_failure(rc, err, wall, children, "hf:does-not/exist", "no model hub is reachable")


@pytest.mark.parametrize("probe", ["missing.csv", "wordnet-nounz", "bad.jsonl"])
def test_bad_probe_file_or_name_fails_in_seconds_naming_it(tmp_path, tiny_model_dir, probe):
    (tmp_path / "bad.jsonl").write_text('{"item_id": "a", "text": "x"}\n{"item_id": "b", "text": \n')
    rc, err, wall, children = _run_watched(
        ["audit", "--model", str(tiny_model_dir), "--probes", str(tmp_path / probe) if "." in probe else probe,
         "--root", str(tmp_path / "root")], _env(tmp_path))
    _assert_fast_clean_failure(rc, err, wall, children, probe)


def test_probe_set_of_only_unknown_tokens_stops_before_embedding(tmp_path, tiny_model_dir):
    # the tiny model's WordPiece vocabulary is ASCII: emoji and Coptic letters are [UNK]; a zero-width space
    # becomes no token at all
    path = tmp_path / "unknown.csv"
    path.write_text("item_id,text\na,🙂🙂\nb,ⲁⲃⲅ\nc,\u200b\u200bⲁ\n", encoding="utf-8")
    rc, err, wall, children = _run_watched(
        ["audit", "--model", str(tiny_model_dir), "--probes", str(path), "--root", str(tmp_path / "root")],
        _env(tmp_path))
    _assert_fast_clean_failure(rc, err, wall, children, "'unknown'", "all 3 texts", "[UNK]", "tiny")


def test_audit_prints_the_kind_it_inferred_for_a_probe_file(tmp_path, tiny_model_dir):
    # the second set is missing, so the audit stops in the pre-flight, after saying what it chose for the first
    words, sentences = tmp_path / "words.csv", tmp_path / "sentences.csv"
    words.write_text("item_id,text\na,dog\nb,cat\n")
    sentences.write_text("item_id,text\na,the dog\nb,cat\n")
    rc, err, wall, children = _run_watched(
        ["audit", "--model", str(tiny_model_dir), "--probes", str(words), "--probes", str(sentences),
         "--probes", str(tmp_path / "missing.csv"), "--root", str(tmp_path / "root")], _env(tmp_path))
    assert rc == 1 and not children, err  # (its speed is the other tests' business)
    lines = err.splitlines()
    assert lines[0].startswith("note: words: kind 'word' inferred for its 2 items (every text is one word")
    assert lines[1].startswith("note: sentences: kind 'sentence' inferred for its 2 items (some texts are more")
    assert lines[2].startswith("error: ") and "missing.csv" in lines[2] and len(lines) == 3


def test_preflight_counts_unknown_items_and_says_the_inferred_kind(tmp_path, tiny_model_dir):
    from pipeline.audit.preflight import check_audit_inputs
    from pipeline.settings import load_settings

    path = tmp_path / "mixed.csv"
    path.write_text("item_id,text\na,dog\nb,🙂\nc,cat\n", encoding="utf-8")
    checked = check_audit_inputs(load_settings(root=str(tmp_path / "root")), str(tiny_model_dir), [str(path)])
    assert checked.resolved.path == str(tiny_model_dir)
    assert [ps.name for ps in checked.probe_sets] == ["mixed"]
    assert checked.notes == ["mixed: kind 'word' inferred for its 3 items (every text is one word without "
                             "whitespace); to choose another of ['doc', 'pair', 'query', 'sentence', 'word'], add "
                             "a kind column or pass --kind to `normaudit probes add`"]
    assert len(checked.warnings) == 1 and "1 of 3 texts" in checked.warnings[0] and "['b']" in checked.warnings[0]
    # --limit 1 audits only 'dog': nothing to warn about
    assert check_audit_inputs(load_settings(root=str(tmp_path / "root")), str(tiny_model_dir), [str(path)],
                              limit=1).warnings == []


def test_preflight_resolves_once_and_imports_no_torch(tmp_path):
    """The pre-flight imports neither torch nor Prefect nor Dask; the flow's own resolve then hits the cache."""
    code = (
        "import sys, time\n"
        "from pipeline.audit.preflight import check_audit_inputs\n"
        "from pipeline.embedding.models import resolve_model\n"
        "from pipeline.settings import load_settings\n"
        f"c = check_audit_inputs(load_settings(root={str(tmp_path / 'root')!r}), 'minilm-l6', ['wordnet-nouns'])\n"
        "t = time.perf_counter(); again = resolve_model('minilm-l6'); t = time.perf_counter() - t\n"
        "assert again == c.resolved and t < 0.05, t\n"
        "print(sorted(m for m in ('torch', 'transformers', 'prefect', 'distributed') if m in sys.modules))\n"
    )
    need_minilm()
    out = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_large_probe_file_is_left_to_the_worker_which_runs_the_same_checks(tmp_path, tiny_model_dir, monkeypatch):
    """Over PREFLIGHT_MAX_BYTES the CLI's process (which runs the flow) does not load the set; the worker does."""
    from pipeline.audit import preflight
    from pipeline.embedding.models import get_spec, resolve_model
    from pipeline.probes import load_probe_set
    from pipeline.probes.base import ProbeInputError
    from pipeline.settings import load_settings

    mixed, unknown = tmp_path / "mixed.csv", tmp_path / "unknown.csv"
    mixed.write_text("item_id,text\na,dog\nb,🙂\nc,cat\n", encoding="utf-8")
    unknown.write_text("item_id,text\na,🙂🙂\nb,ⲁⲃⲅ\n", encoding="utf-8")
    settings = load_settings(root=str(tmp_path / "root"))
    small = preflight.check_audit_inputs(settings, str(tiny_model_dir), [str(mixed)])
    assert [ps.name for ps in small.probe_sets] == ["mixed"] and len(small.warnings) == 1  # checked here

    monkeypatch.setattr(preflight, "PREFLIGHT_MAX_BYTES", 10)  # both files are "large" now
    large = preflight.check_audit_inputs(settings, str(tiny_model_dir), [str(mixed), str(unknown)])
    assert large.probe_sets == [] and large.warnings == []  # nothing loaded in this process
    assert [n.split(":")[0] for n in large.notes] == [str(mixed), str(unknown)]
    assert all("loaded and checked by the worker" in n for n in large.notes)
    resolved = resolve_model(get_spec(str(tiny_model_dir)))
    warning = preflight.unknown_token_warning(settings, resolved, load_probe_set(str(mixed)), str(mixed))
    assert warning == small.warnings[0]  # the worker says what the pre-flight would have said
    with pytest.raises(ProbeInputError, match="all 2 texts"):
        preflight.unknown_token_warning(settings, resolved, load_probe_set(str(unknown)), str(unknown))


def test_unknown_only_items_agree_with_tokenizing_every_text_whole(tiny_model_dir, monkeypatch):
    """The word-first shortcut names exactly the items that tokenizing each whole text names (the definition),
    through every round of word lookups and on to the texts left over."""
    import random
    from types import SimpleNamespace

    import polars as pl

    from pipeline.audit import preflight

    vocab = preflight._vocabulary(tiny_model_dir)
    edge = ["", "   ", "\t\n", "dog", "dog 🙂", "🙂 dog.", "🙂🙂 ⲁⲃⲅ", "ⲁⲃⲅ,",  # the comma is a known token
            "the cat sat", "x" * 300 + " dog"]
    rng = random.Random(7)
    pool = ["dog", "cat.", "the", "🙂", "ⲁⲃⲅ", "ⲁ,", "©", "", "\u00a0"]
    mixed = [" ".join(rng.choice(pool) for _ in range(rng.randint(0, 4))) for _ in range(3000)]
    # thousands of distinct unknown words: several rounds of lookups, then whole texts
    rare = ["".join(chr(0x2C80 + rng.randrange(100)) for _ in range(6)) + " " + rng.choice(["", "dog"])
            for _ in range(6000)]
    texts = edge + mixed + rare
    items = pl.DataFrame({"item_id": [f"i{k}" for k in range(len(texts))], "text": texts})
    ps = SimpleNamespace(items=items)  # only the items are read; blank texts, which a probe file may not hold, too
    whole = [i for i, t in zip(items["item_id"], texts, strict=True)
             if all(x == vocab.unk_id for x in vocab.tokenizer.encode(preflight._head(t),
                                                                       add_special_tokens=False).ids)]
    monkeypatch.setattr(preflight, "_FIRST_WORDS", 64)  # many rounds on a test-sized set
    monkeypatch.setattr(preflight, "_LAST_WORDS", 1024)
    found = preflight.unknown_only_items(ps, vocab)
    assert found == whole
    # the last: its first 256 characters are one word too long for the vocabulary
    assert {"i0", "i1", "i2", "i6", "i9"} <= set(found) and not {"i3", "i4", "i5", "i7", "i8"} & set(found)
    assert 0 < len(found) < len(texts)
