"""Device and numeric precision: what the run uses, decided once at start-up and said out loud."""
from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
from dataclasses import dataclass

import torch

from .errors import TformerError


def pick_device(name: str, key: str = "trainer.device") -> torch.device:
    """`key`: the option the user typed (trainer.device; device= of evaluate, suggest and Classifier.load), named in
    refusals."""
    name = str(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TformerError(f"{key}={name} but CUDA is not available on this machine; use {key}=auto or {key}=cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise TformerError(f"{key}=mps but MPS is not available; use {key}=auto or cpu")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise TformerError(f"{key}={name} is not a device torch knows; use auto, cpu, cuda or mps") from exc


class _HostAllocator:
    owned = False  # the CLI owns its process; the library API leaves the caller's allocator alone
    mode = "system"


def own_host_allocator() -> None:
    """Called by the `tformer` CLI: its commands may tune the process-wide allocator (keep_freed_host_memory)."""
    _HostAllocator.owned = True


def keep_freed_host_memory(device: torch.device) -> str:
    """Let glibc's malloc keep the memory that freed tensors give back, so the next step reuses it.

    By default glibc serves every block over its mmap threshold (at most 32 MB: attention scores and activations of
    long documents are hundreds of MB a step) with a fresh mmap and unmaps it on free, so the kernel maps and zeroes
    those pages again on every step: on CPU half the training time went into page faults (IMDB, MiniLM, 512
    tokens). Served from the heap, freed blocks are reused; `release_freed_host_memory` hands the free pages back
    at epoch ends, so a one-off peak is not held for the rest of the run.
    Only for the CLI's `train`, `pretrain` and `evaluate` on CPU (own_host_allocator): a library call must not
    change its caller's process. Left alone when the process uses another allocator (LD_PRELOAD of jemalloc or
    tcmalloc), when GLIBC_TUNABLES or MALLOC_* variables tune glibc's, or with TFORMER_HOST_ALLOCATOR=system.
    Returns what it did, for the run log: "retain" or "system (why)".
    """
    choice = os.environ.get("TFORMER_HOST_ALLOCATOR", "retain")
    if choice not in ("retain", "system"):
        raise TformerError(f"TFORMER_HOST_ALLOCATOR={choice} must be retain (the default) or system")
    if _HostAllocator.mode == "retain":
        return "retain"
    if not _HostAllocator.owned:
        return "system (library use)"
    if choice == "system":
        return "system (TFORMER_HOST_ALLOCATOR=system)"
    if device.type != "cpu":  # tensors live on the accelerator
        return "system"
    if not sys.platform.startswith("linux"):
        return "system"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "system (GLIBC_TUNABLES tunes malloc)"
    tuned = sorted(k for k in os.environ if k.startswith("MALLOC_") and k != "MALLOC_CONF")  # (CONF: jemalloc's)
    if tuned:
        return f"system ({tuned[0]} is set)"
    try:
        if platform.libc_ver()[0] != "glibc":
            return "system"
        libc = ctypes.CDLL("libc.so.6")
        used = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
        if used != ctypes.cast(libc.malloc, ctypes.c_void_p).value:
            return "system (another malloc is loaded)"
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # malloc.h
        # mmap_max 0: large blocks come from the heap too; its top is trimmed only beyond 2 GB of free memory
        if libc.mallopt(M_MMAP_MAX, 0) != 1:
            return "system"
        if libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) != 1:
            libc.mallopt(M_MMAP_MAX, 65536)  # glibc's default
            return "system"
    except (OSError, AttributeError):
        return "system"
    _HostAllocator.mode = "retain"
    return "retain"


def release_freed_host_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc malloc_trim) once keep_freed_host_memory kept them: at an
    epoch's end, so what a peak (the first batches, a validation pass, loading) left free is not held all run."""
    if _HostAllocator.mode != "retain":
        return
    ctypes.CDLL("libc.so.6").malloc_trim(0)


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
