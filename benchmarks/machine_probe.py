"""The machine the cost model predicts for: measured here by a short probe, or given.

``python -m benchmarks.machine_probe`` measures this machine (about 10 s) and prints it as
JSON, which ``--save PATH`` also writes; :func:`load_machine` takes a preset's name, a saved
probe, or ``probe`` (measure now).

The probe times, on one rank with ``threads`` threads: a projection-shaped matrix product,
the windowed attention kernel (W = 16, 64, 256, 1024) and the fused global kernel, forward
and backward (useful FLOPs per second); and, between two local gloo ranks, the latency of a
small message and the bandwidth of a large one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from benchmarks.cost_model import Machine

GIB = 2**30
WINDOWS = (16, 64, 256, 1024)  # the probe's windows for the attention kernel's rate

# GPU clusters, from published figures; rates are the peak times an efficiency stated here.
PRESETS: dict[str, Machine] = {
    "h100_nvlink_ib": Machine(
        name="h100_nvlink_ib",
        # H100 SXM5: 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet); 60% of it in GEMMs,
        # 45% in windowed attention, 55% in global attention (FlashAttention-3 reaches 75%
        # forward, Shah et al. 2024, arXiv:2407.08608; backward and block-sparse masks less).
        gemm_flop_s=0.60 * 989e12,
        window_attention_flop_s=0.45 * 989e12,
        global_attention_flop_s=0.55 * 989e12,
        # NVLink 4: 900 GB/s per GPU both ways, 450 GB/s each way (datasheet); NCCL reaches
        # about 80% of it; 10 us per NCCL operation inside a node.
        latency_s=10e-6,
        bandwidth_b_s=0.8 * 450e9,
        memory_b=80 * 1e9,
        ranks_per_node=8,
        # One ConnectX-7 NDR InfiniBand port per GPU: 400 Gb/s = 50 GB/s each way (NVIDIA DGX
        # H100 user guide); 80% of it, 20 us per operation between nodes.
        inter_node_latency_s=20e-6,
        inter_node_bandwidth_b_s=0.8 * 50e9,
        # Memory-bound work: 60 bytes of HBM traffic per value and layer (norms, softmax,
        # activations, residuals; bf16, forward and backward), a copy 4 bytes, at 60% of the
        # 3.35 TB/s of HBM3 (datasheet); both assumed.
        other_s_per_value=60 / (0.6 * 3.35e12),
        copy_s_per_value=4 / (0.6 * 3.35e12),
        source="NVIDIA H100 datasheet and DGX H100 guide; FlashAttention-3 (arXiv:2407.08608); efficiencies assumed",
    ),
    "a100_nvlink_ib": Machine(
        name="a100_nvlink_ib",
        # A100 SXM4 80GB: 312 TFLOP/s dense bf16; NVLink 3: 600 GB/s both ways; HDR 200 Gb/s per GPU.
        gemm_flop_s=0.60 * 312e12,
        window_attention_flop_s=0.40 * 312e12,
        global_attention_flop_s=0.50 * 312e12,
        latency_s=10e-6,
        bandwidth_b_s=0.8 * 300e9,
        memory_b=80 * 1e9,
        ranks_per_node=8,
        inter_node_latency_s=20e-6,
        inter_node_bandwidth_b_s=0.8 * 25e9,
        other_s_per_value=60 / (0.6 * 2.0e12),  # HBM2e: 2.0 TB/s
        copy_s_per_value=4 / (0.6 * 2.0e12),
        source="NVIDIA A100 datasheet and DGX A100 guide; efficiencies assumed",
    ),
}


def probe(threads: int = 1, channels: int = 128, heads: int = 8) -> Machine:
    """Measure this machine for ranks of ``threads`` threads each (a model of ``channels``)."""
    import torch

    torch.set_num_threads(threads)
    gemm = _gemm_rate(channels)
    curve = tuple((w, _attention_rate(4096, w, channels, heads)) for w in WINDOWS)
    global_ = _attention_rate(4096, None, channels, heads)
    latency, bandwidth = _link()
    other = _other_per_value(channels, heads, gemm, dict(curve)[64])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
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

    x, w = torch.randn(16384, channels), torch.randn(channels, 4 * channels)
    return 2 * 16384 * channels * 4 * channels * 4 / _timed(lambda: [x @ w for _ in range(4)], repeat=5)


def _copy_per_value(channels: int) -> float:
    """Seconds per value to rearrange q, k, v as an all-to-all does."""
    import torch

    x = torch.randn(8192, 3, 8, channels // 8)
    return _timed(lambda: x.permute(1, 2, 0, 3).contiguous()) / x.numel()


def _other_per_value(channels: int, heads: int, gemm: float, attention: float) -> float:
    """What a one-rank processor step takes beyond its GEMM and attention FLOPs, per point,
    channel and layer: norms, softmax, activations, residuals and copies."""
    import torch

    from benchmarks.flops import processor_flops, window_pairs
    from processor import ProcessorConfig, TransformerProcessor

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

    from benchmarks.flops import window_pairs
    from processor.attention.kernel import sliding_window_attention

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


def load_machine(name: str, threads: int = 1, channels: int = 128, heads: int = 8) -> Machine:
    """A preset by name, a probe saved as JSON (a path), or ``probe``: measure now (ranks of
    ``threads`` threads, kernels shaped for ``channels`` and ``heads``)."""
    if name in PRESETS:
        return PRESETS[name]
    if name == "probe":
        return probe(threads, channels, heads)
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        values = json.loads(path.read_text())
        values["window_attention_curve"] = tuple(tuple(p) for p in values.get("window_attention_curve", ()))
        return Machine(**values)
    raise ValueError(f"machine {name!r}: expected 'probe', a saved probe (.json) or one of {sorted(PRESETS)}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="threads per rank")
    parser.add_argument("--save", type=Path, help="write the probe here as JSON")
    args = parser.parse_args(argv)
    machine = probe(args.threads)
    text = json.dumps(dataclasses.asdict(machine), indent=2)
    print(text)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(text + "\n")


if __name__ == "__main__":
    main()
