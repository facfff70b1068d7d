"""Measure this machine for the planner, about 10 s (``python -m benchmarks.machine_probe``).

The probe times, on one rank with ``threads`` threads: a projection-shaped matrix product,
the windowed attention kernel (W = 16, 64, 256, 1024) and the fused global kernel, forward
and backward (useful FLOPs per second), the memory-bound work beside them; and, between two
local gloo ranks, the latency of a small message and the bandwidth of a large one.
"""

from __future__ import annotations

import os
import time

from processor.host import torch_threads, usable_cores
from processor.plan.machine import Machine

WINDOWS = (16, 64, 256, 1024)  # the probe's windows for the attention kernel's rate


def probe(threads: int = 1, channels: int = 128, heads: int = 8) -> Machine:
    """Measure this machine for ranks of ``threads`` threads each (a model of ``channels``)."""
    with torch_threads(threads):  # as fast as a rank runs it; the caller's threads put back
        gemm = _gemm_rate(channels)
        curve = tuple((w, _attention_rate(4096, w, channels, heads)) for w in WINDOWS)
        global_ = _attention_rate(4096, None, channels, heads)
        latency, bandwidth = _link()
        other = _other_per_value(channels, heads, gemm, dict(curve)[64])
        cores = usable_cores()
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return Machine(
            name="probe",
            gemm_flop_s=gemm,
            window_attention_flop_s=dict(curve)[64],
            window_attention_curve=curve,
            other_s_per_value=other,
            copy_s_per_value=_copy_per_value(channels),
            global_attention_flop_s=global_,
            latency_s=latency,
            bandwidth_b_s=bandwidth,
            memory_b=memory,
            parallel_ranks=max(1, cores // threads),
            shared_memory=True,
            source=f"probe on {os.uname().nodename}, {cores} cores, {threads} thread(s) per rank, gloo over loopback",
        )


def _timed(fn, repeat: int = 3) -> float:
    fn()  # warm up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _gemm_rate(channels: int) -> float:
    import torch

    from processor.matmul import linear  # the process's GEMM backend, as the model's linears run

    x, w = torch.randn(16384, channels), torch.randn(4 * channels, channels)
    return 2 * 16384 * channels * 4 * channels * 4 / _timed(lambda: [linear(x, w) for _ in range(4)], repeat=5)


def _copy_per_value(channels: int) -> float:
    """Seconds per value to rearrange q, k, v as an all-to-all does."""
    import torch

    x = torch.randn(8192, 3, 8, channels // 8)
    return _timed(lambda: x.permute(1, 2, 0, 3).contiguous()) / x.numel()


def _other_per_value(channels: int, heads: int, gemm: float, attention: float) -> float:
    """What a one-rank processor step takes beyond its GEMM and attention FLOPs, per point,
    channel and layer: norms, softmax, activations, residuals and copies."""
    import torch

    from processor import ProcessorConfig, TransformerProcessor
    from processor.plan.flops import processor_flops, window_pairs

    n, layers, window = 8192, 2, 64
    config = ProcessorConfig(num_layers=layers, num_channels=channels, num_heads=heads, window_size=window)
    model = TransformerProcessor(config)
    x = torch.randn(1, n, channels, requires_grad=True)
    measured = _timed(lambda: model(x).sum().backward())
    attention_flops = 3 * layers * 4 * channels * window_pairs(n, window)
    dense_flops = processor_flops(n, channels, window, layers, config.mlp_hidden_ratio) - attention_flops
    return max(0.0, measured - dense_flops / gemm - attention_flops / attention) / (n * channels * layers)


def _attention_rate(n: int, window: int | None, channels: int, heads: int) -> float:
    import torch

    from processor.attention.kernel import sliding_window_attention
    from processor.plan.flops import window_pairs

    d = channels // heads
    q, k, v = (torch.randn(1, heads, n, d, requires_grad=True) for _ in range(3))

    def step() -> None:
        sliding_window_attention(q, k, v, window).sum().backward()

    return 3 * 4 * channels * window_pairs(n, window) / _timed(step)


def _link() -> tuple[float, float]:
    """(latency, bandwidth) between two local gloo ranks."""
    from processor.runtime import run_local

    return tuple(run_local(_ping_pong, 2, timeout_s=120.0)[0])  # type: ignore[return-value]


def _ping_pong() -> tuple[float, float]:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()

    def exchange(t: torch.Tensor, times: int) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(times):
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        return (time.perf_counter() - start) / (2 * times)

    exchange(torch.zeros(1 << 20), 2)
    latency = exchange(torch.zeros(1), 200)
    big = torch.zeros(4 << 20)  # 16 MiB
    per_message = exchange(big, 5)
    return latency, big.numel() * 4 / max(per_message - latency, 1e-9)
