"""Where the model runs: choosing the device, CPU memory tuning, and copies between host and device.

On CUDA, host buffers are page-locked (pinned) and copies are asynchronous: a copy from or to pageable
memory waits for the GPU to finish all the work queued before it, and the embedder queues a whole
chunk of batches without waiting. torch is imported inside functions (see :mod:`pipeline.embedding.embed`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HostCopy",
    "activation_bytes",
    "keep_freed_memory",
    "mmap_threshold_for",
    "pick_device",
    "to_device",
    "to_host",
]

# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): blocks up to it can be kept in the heap
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
MMAP_THRESHOLD_MIN = 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024
_mmap_threshold = 0  # what this process's malloc was last set to (0: not tuned)


def activation_bytes(config, batch_tokens: int) -> int | None:
    """Bytes of the largest activation one forward batch of ``batch_tokens`` padded tokens allocates: a
    (tokens x width) block of float32 (a lower precision's blocks are smaller; the output is float32 whatever
    it is), the width being the feed-forward's (``intermediate_size``) or the hidden size, whichever is larger.
    ``None`` where a transformers ``config`` names neither width."""
    widths = [w for w in (getattr(config, "intermediate_size", None), getattr(config, "hidden_size", None))
              if isinstance(w, int) and w > 0]
    return batch_tokens * max(widths) * 4 if widths else None


def mmap_threshold_for(block_bytes: int | None) -> int:
    """The mmap threshold that keeps blocks of ``block_bytes`` in the heap: the smallest power of two above it,
    at least :data:`MMAP_THRESHOLD_MIN` and at most :data:`MMAP_THRESHOLD_MAX` (also for ``None``, unknown)."""
    if block_bytes is None:
        return MMAP_THRESHOLD_MAX
    return min(MMAP_THRESHOLD_MAX, max(MMAP_THRESHOLD_MIN, 1 << int(block_bytes).bit_length()))


def keep_freed_memory(block_bytes: int | None = None) -> int:
    """Stop glibc from handing activation buffers back to the OS after every batch (CPU only); returns the mmap
    threshold the process now has (0 where the C library has no ``mallopt``).

    By default glibc serves large blocks with mmap and trims the heap eagerly, so every batch
    re-faults its activations page by page (about 50k minor faults per MiniLM batch of 4k tokens,
    ~10% of the forward time). Raising the mmap threshold just above the batch's largest activation block
    (``block_bytes``, see :func:`activation_bytes` and :func:`mmap_threshold_for`: 32 MiB for MiniLM, 2 MiB for
    a model of width 64) and the trim threshold to 1 GiB keeps freed blocks mapped for the next batch. The
    threshold follows the model, not its maximum: blocks between it and 32 MiB that live once per chunk or
    shard (token ids, output arrays) are then mapped and unmapped whole instead of fragmenting the heap, which
    made a worker embedding the tests' tiny model creep ~28 MB a shard up to 0.35 GiB (docs/benchmarks.md).
    Process-wide; a later call only raises the threshold (another model in the process keeps its blocks).
    """
    global _mmap_threshold
    threshold = mmap_threshold_for(block_bytes)
    if threshold <= _mmap_threshold:
        return _mmap_threshold
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        if libc.mallopt(m_mmap_threshold, threshold) and libc.mallopt(m_trim_threshold, TRIM_THRESHOLD):
            _mmap_threshold = threshold
    except (OSError, AttributeError):
        pass
    return _mmap_threshold


def pick_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` if available, else ``mps``, else ``cpu``; explicit names are checked."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} requested but torch sees no CUDA GPU; use device='cpu' or 'auto'"
        )
    return device


def to_device(array: np.ndarray, device: str):
    """``array`` as a tensor on ``device``: shared, not copied, on CPU; an asynchronous copy on CUDA.

    The pinned host copy is safe to drop at once: torch's pinned-memory allocator keeps the block
    until the copy that reads it has run.
    """
    import torch

    tensor = torch.from_numpy(array)
    if device.startswith("cuda"):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass(frozen=True)
class HostCopy:
    """Tensors on their way to host memory; :meth:`numpy` waits for them."""

    tensors: tuple  # host tensors being filled (CUDA), or the tensors themselves (CPU, MPS)
    ready: object = None  # torch.cuda.Event recorded after the copies; None: nothing to wait for

    def numpy(self) -> list[np.ndarray]:
        """The tensors as numpy arrays, once copied (on MPS the copy happens here)."""
        if self.ready is not None:
            self.ready.synchronize()
        return [t.cpu().numpy() for t in self.tensors]


def to_host(*tensors) -> HostCopy:
    """Start copying ``tensors`` to host memory without waiting for the device (CUDA); elsewhere no-op."""
    import torch

    if not tensors or tensors[0].device.type != "cuda":
        return HostCopy(tensors)
    host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors)
    for h, t in zip(host, tensors, strict=True):
        h.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    # the copies went to the tensors' device's current stream, which need not be the current device's
    ready.record(torch.cuda.current_stream(tensors[0].device))
    return HostCopy(host, ready)
