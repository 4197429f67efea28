"""The dtype the model's forward pass runs in (``--precision``), and where each one may run.

``float32`` runs everywhere and is the default. ``bfloat16`` and ``float16`` cast the transformer's weights
(:meth:`pipeline.embedding.embed.Embedder`); pooling and the norm stay in float32 / float64. A reduced
precision is a different measurement: it is part of the shard hash, the manifest and the ``runs`` row
(:func:`pipeline.audit.steps.embedding_params`), and a release label holds one precision only
(:func:`default_release`, :func:`refuse_mixed_release`).

:func:`check_precision` refuses what a device cannot run natively, naming the device and what to use:

- CUDA: bfloat16 needs compute capability 8.0 or newer (torch's ``is_bf16_supported`` without emulation);
  older GPUs run float16 natively. float16 runs on every CUDA GPU torch supports.
- MPS: float16 always; bfloat16 where torch can allocate it on the device (macOS 14 or newer).
- CPU: bfloat16 where the CPU has bfloat16 instructions (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``),
  read from ``/proc/cpuinfo`` (elsewhere it is allowed: torch decides). Without them torch emulates it,
  slower than float32. float16 is refused on every CPU: torch has no float16 matrix path on CPUs
  without AMX-FP16, and on this project's 2-core Xeon (``avx512_fp16``, AMX for bfloat16 only) MiniLM in
  float16 ran 0.17x-0.35x float32 on 20,000 words (bfloat16: faster than float32); use bfloat16 there.

torch is imported inside functions: the CLI checks a precision without paying for it unless it must.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Literal

__all__ = [
    "PRECISIONS",
    "Precision",
    "UnsupportedPrecision",
    "check_precision",
    "check_requested_precision",
    "cpu_bf16_instructions",
    "cpu_name",
    "refuse_mixed_release",
    "default_release",
    "torch_dtype",
]

Precision = Literal["float32", "bfloat16", "float16"]
PRECISIONS: tuple[str, ...] = ("float32", "bfloat16", "float16")
_CPU_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 (AVX-512 BF16, AMX), Arm (FEAT_BF16)


class UnsupportedPrecision(ValueError):
    """A precision the device cannot run (natively): the message names the device and what to use instead."""


def torch_dtype(precision: str):
    """The torch dtype of a precision name."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return getattr(torch, precision)


def _cpuinfo_field(keys: tuple[str, ...], cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The value of the first ``cpuinfo`` line whose key is one of ``keys``; None where there is none or the
    file cannot be read (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_bf16_instructions(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU has bfloat16 instructions; None where ``cpuinfo`` cannot be read (not Linux)."""
    flags = _cpuinfo_field(("flags", "Features"), cpuinfo)
    return None if flags is None else bool(_CPU_BF16_FLAGS & set(flags.split()))


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one), for messages and benchmark headers."""
    return _cpuinfo_field(("model name",)) or platform.processor() or platform.machine() or "this CPU"


def check_precision(device: str, precision: str) -> None:
    """Raise :class:`UnsupportedPrecision` when ``device`` (a picked device: cpu, cuda[:N], mps) cannot run
    ``precision`` natively; the message names the device and the precision to use instead."""
    if precision not in PRECISIONS:
        raise UnsupportedPrecision(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "float32":
        return
    if device.startswith("cuda"):
        import torch

        if precision == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name(device)
            major, minor = torch.cuda.get_device_capability(device)
            raise UnsupportedPrecision(
                f"--precision bfloat16: the GPU {device} ({name}, compute capability {major}.{minor}) has no "
                "bfloat16 arithmetic (it needs 8.0 or newer); use --precision float16 (native on it) or float32"
            )
        return
    if device.startswith("mps"):
        import torch

        if precision == "bfloat16":
            try:
                torch.zeros(1, dtype=torch.bfloat16, device=device)
            except (RuntimeError, TypeError) as exc:
                raise UnsupportedPrecision(
                    f"--precision bfloat16: torch cannot run bfloat16 on {device} ({exc}); macOS 14 or newer has "
                    "it. Use --precision float16 (native on Apple GPUs) or float32"
                ) from None
        return
    if precision == "float16":
        raise UnsupportedPrecision(
            f"--precision float16 on the CPU ({cpu_name()}): CPUs have no float16 matrix units torch uses here, "
            "so it runs slower than float32 (MiniLM about 0.3x on a Xeon with avx512_fp16). Use --precision bfloat16 "
            "where the CPU has bfloat16 instructions (avx512_bf16/amx_bf16), else float32; float16 is for GPUs"
        )
    if cpu_bf16_instructions() is False:
        raise UnsupportedPrecision(
            f"--precision bfloat16 on the CPU ({cpu_name()}): it has no bfloat16 instructions (avx512_bf16, "
            "amx_bf16 or Arm bf16), so torch would emulate them, slower than float32. Use --precision float32 "
            "here, or bfloat16 on a CPU or GPU that has them"
        )


def check_requested_precision(device: str, precision: str) -> None:
    """:func:`check_precision` for a device setting (auto, cpu, cuda[:N], mps): torch is imported only to
    pick the device, never for an explicit ``cpu`` or for float32."""
    if precision == "float32":
        return
    if device != "cpu":
        from pipeline.embedding.devices import pick_device

        device = pick_device(device)
    check_precision(device, precision)


def default_release(fingerprint: str, precision: str) -> str:
    """The default release label: the fingerprint's first 12 hex, plus ``-<precision>`` unless float32.

    float32 keeps the label releases always had; a reduced-precision audit gets its own release, so a
    release's rows stay one measurement and the two can be compared (``normaudit compare``).
    """
    base = fingerprint[:12]
    return base if precision == "float32" else f"{base}-{precision}"


def refuse_mixed_release(manifests, model: str, release: str, precision: str) -> None:
    """Raise :class:`ValueError` when one of ``manifests`` (the release's, one per probe set:
    :meth:`pipeline.storage.store.Store.manifests`) records another precision than ``precision``.

    Manifests written before precision was recorded read as float32.
    """
    for m in manifests:
        stored = m.precision
        if stored != precision:
            raise ValueError(
                f"release {release!r} of {model!r} already holds {stored} embeddings (probe set {m.probe_set!r}); "
                f"a release is one measurement, so a {precision} audit cannot add to it. Leave out --release "
                f"(a {precision} audit gets its own label) or pass a new one, e.g. --release {release}-{precision}, "
                "then compare the two with `normaudit compare --release A --against-release B`"
            )
