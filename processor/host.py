"""What kind of machine this is, as the kernels and every benchmark table name it: the CPU's model
and its vector extensions (AVX2, AVX-512, AVX512-BF16, AMX), or the GPU's name. The machines our
users have differ by these (a kernel tuned on one can be slow on another), so a figure without
them cannot be compared."""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

# /proc/cpuinfo flags -> the names the docs use, in order of width.
ISA_FLAGS = (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX"))


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """The CPU's model name and flags (Linux; elsewhere the platform's processor and no flags)."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() in ("flags", "Features"):
            flags = frozenset(value.split())
        if model and flags:
            break
    return model, flags


def cpu_isa() -> list[str]:
    """The vector extensions of :data:`ISA_FLAGS` this CPU has, e.g. ``["AVX2", "AVX-512"]``."""
    flags = _cpuinfo()[1]
    return [name for flag, name in ISA_FLAGS if flag in flags]


def cpu_name() -> str:
    """The CPU's model and extensions: ``"AMD EPYC (AVX2, AVX-512, AVX512-BF16)"``."""
    model = _cpuinfo()[0]
    isa = cpu_isa()
    return f"{model} ({', '.join(isa)})" if isa else model


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS tells it, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` inside, restored after (a probe timed as fast
    as a rank will run)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cache_dir() -> Path:
    """Where this machine keeps what is worth measuring or making once (the attention paths'
    timings, an empty MLflow store): ``$GRIDSHARD_CACHE_DIR``, else ``gridshard`` under
    ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    root = os.environ.get("GRIDSHARD_CACHE_DIR")
    if root is None:
        root = str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gridshard")
    return Path(root)


def device_name(device: torch.device) -> str:
    """The GPU's name for a CUDA device, else :func:`cpu_name`."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()
