"""Device and numeric precision: what the run uses, decided once at start-up and said out loud."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .errors import TformerError


def pick_device(name: str) -> torch.device:
    name = str(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TformerError(f"trainer.device={name} but CUDA is not available on this machine; use trainer.device=auto "
                           f"or trainer.device=cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise TformerError("trainer.device=mps but MPS is not available; use trainer.device=auto or cpu")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise TformerError(f"trainer.device={name} is not a device torch knows; use auto, cpu, cuda or mps") from exc


_HOST_ALLOCATOR_SET = False


def keep_freed_host_memory(device: torch.device) -> str:
    """Let glibc's malloc keep the memory that freed tensors give back, for the rest of the process.

    By default glibc serves every allocation over a few MB (attention scores, activations: hundreds of MB a step
    on long documents) with a fresh mmap and unmaps it on free, so the kernel maps and zeroes those pages again on
    every step: on CPU half the training time went into page faults (IMDB, MiniLM, 512 tokens). Serving them from
    the heap and not trimming it reuses the pages; RSS stays near the peak (some 10-20% above the default's).
    Called by the `train`, `pretrain` and `evaluate` commands on CPU, not by the library API (it changes the whole
    process). Left alone when the user chose an allocator (LD_PRELOAD, GLIBC_TUNABLES, MALLOC_* variables) or set
    TFORMER_HOST_ALLOCATOR=system. Returns what it did, for the run log.
    """
    global _HOST_ALLOCATOR_SET
    import os
    import sys

    if device.type != "cpu":  # tensors live on the accelerator; the host allocator is not the bottleneck
        return "system"
    if _HOST_ALLOCATOR_SET:
        return "retain"
    if os.environ.get("TFORMER_HOST_ALLOCATOR", "retain") == "system":
        return "system (TFORMER_HOST_ALLOCATOR=system)"
    if not sys.platform.startswith("linux"):
        return "system"
    chosen = [k for k in os.environ if k in ("LD_PRELOAD", "GLIBC_TUNABLES") or k.startswith("MALLOC_")]
    if chosen:
        return f"system ({chosen[0]} is set)"
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return "system"
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "system"
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
    # mmap_max 0: large blocks come from the heap too; trim only beyond 2 GB of free memory at the heap's top
    if libc.mallopt(M_MMAP_MAX, 0) != 1 or libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) != 1:
        return "system"
    _HOST_ALLOCATOR_SET = True
    return "retain"


def cpu_supports_bf16() -> bool:
    """bf16 pays off on CPUs with native bf16 dot products (AVX512-BF16 or AMX); elsewhere it is emulated."""
    return _cpu_flag("avx512_bf16") or _cpu_flag("amx_bf16")


def _cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@dataclass
class Precision:
    name: str  # bf16 | fp16 | fp32
    device_type: str

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """Loss scaling for fp16 on CUDA; a disabled scaler (its calls pass straight through) elsewhere."""
        return torch.amp.GradScaler(self.device_type, enabled=self.name == "fp16" and self.device_type == "cuda")


def pick_precision(name: str, device: torch.device) -> Precision:
    """auto: bf16 on Ampere+ GPUs and CPUs with bf16 instructions, fp16 (+ loss scaling) on older GPUs, else fp32."""
    name = str(name)
    if name == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        elif device.type == "cpu" and cpu_supports_bf16():
            name = "bf16"
        else:
            name = "fp32"
    if name not in ("bf16", "fp16", "fp32"):
        raise TformerError(f"trainer.precision={name} must be auto, bf16, fp16 or fp32")
    if name == "fp16" and device.type == "cpu":
        raise TformerError("trainer.precision=fp16 is for GPUs; on CPU use bf16 or fp32")
    return Precision(name, device.type)


class MaybeCompiled:
    """`torch.compile(model)` when asked for, falling back to eager (with one message) if compiling fails,
    which happens lazily at the first call on platforms without a working compiler toolchain."""

    def __init__(self, model: torch.nn.Module, enabled: bool, say=print):
        self.model, self.say, self.compiled = model, say, None
        if enabled:
            try:
                self.compiled = torch.compile(model, dynamic=True)
            except Exception as exc:  # noqa: BLE001 - any failure means: run eagerly
                say(f"torch.compile is not available here ({type(exc).__name__}); running eagerly")

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                self.say(f"torch.compile failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); "
                         f"running eagerly")
                self.compiled = None
        return self.model(*args, **kwargs)
