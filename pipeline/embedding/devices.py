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

__all__ = ["HostCopy", "keep_freed_memory", "pick_device", "to_device", "to_host"]

_MALLOC_TUNED = False


def keep_freed_memory() -> None:
    """Stop glibc from handing activation buffers back to the OS after every batch (CPU only).

    By default glibc serves large blocks with mmap and trims the heap eagerly, so every batch
    re-faults its activations page by page (about 50k minor faults per MiniLM batch of 4k tokens,
    ~10% of the forward time). Raising the mmap threshold to its 32 MiB maximum and the trim
    threshold to 1 GiB keeps freed blocks mapped for the next batch. Process-wide, applied once;
    a no-op where the C library has no ``mallopt``.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


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
