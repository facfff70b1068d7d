"""The in-process fp32 GEMM rate every efficiency figure is a share of (torch only)."""

from __future__ import annotations

import time

import torch


def gemm_flop_rate(device: torch.device, size: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of a ``size``-cubed fp32 matmul on this process's threads (best of ``repeats``)."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
