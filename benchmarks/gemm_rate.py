"""The in-process fp32 GEMM rate every efficiency figure is a share of (torch only): on a CPU the
faster of torch's own matmul (MKL) and oneDNN's (:mod:`processor.matmul`). MKL runs its AVX2 code
on AMD processors: on a Zen 5 host oneDNN's GEMM ran 2.0-2.2x MKL's, and a share of MKL's alone
read above 1 (docs/benchmarks/matmul_zen5_2026-11-29.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from processor.matmul import linear, matmul_backend, set_matmul_backend


def _best_seconds(product: Callable[[], torch.Tensor], device: torch.device, repeats: int) -> float:
    product()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        product()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def gemm_flop_rate(device: torch.device, size: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of a ``size``-cubed fp32 matmul on this process's threads (best of ``repeats``; on
    a CPU, of torch's matmul and oneDNN's)."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    best = _best_seconds(lambda: a @ b, device, repeats)
    if device.type == "cpu" and torch.backends.mkldnn.is_available():
        previous = matmul_backend()
        set_matmul_backend("onednn")
        try:
            best = min(best, _best_seconds(lambda: linear(a, b), device, repeats))
        finally:
            set_matmul_backend(previous)
    return 2 * size**3 / best
