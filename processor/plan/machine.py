"""What the planner predicts for: a machine's rates, links and memory per rank.

A :class:`Machine` is measured here by a short probe (:func:`processor.plan.probe.probe`,
``strategy.machine=probe``), saved as JSON, or one of the :data:`PRESETS` from published
figures (``strategy.machine=h100_nvlink_ib``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Machine:
    """What a rank can do, and its links. Rates are per rank, when it runs alone on its cores."""

    name: str
    gemm_flop_s: float  # dense matrix products (projections, MLP), in the step's precision
    window_attention_flop_s: float  # useful FLOP/s of the windowed (banded) attention kernel
    global_attention_flop_s: float  # ... of global attention (the fused kernel)
    latency_s: float  # per message, inside a node
    bandwidth_b_s: float  # bytes per second one rank sends to another, inside a node
    memory_b: float  # per rank (with ``shared_memory``: the node's, shared by its ranks)
    parallel_ranks: int = 1 << 30  # ranks that run at full speed at once (CPU: cores / threads)
    ranks_per_node: int = 1 << 30
    inter_node_latency_s: float | None = None  # None: as inside a node
    inter_node_bandwidth_b_s: float | None = None
    shared_memory: bool = False
    # Measured windowed-attention rates by window, ``((W, FLOP/s), ...)`` ascending in W; when
    # given, a window between two is interpolated in log W (the kernel's blocks grow with W).
    window_attention_curve: tuple[tuple[int, float], ...] = ()
    # Memory-bound work the FLOP model leaves out (norms, softmax, activations, residuals,
    # layout copies), per point, channel and layer of forward+backward; and one more copy of a
    # value (the all-to-alls' rearranging, the gathers' concatenation).
    other_s_per_value: float = 0.0
    copy_s_per_value: float = 0.0
    source: str = ""  # where the numbers come from

    def slowdown(self, ranks: int) -> float:
        """How much slower each of ``ranks`` ranks computes when they share the cores."""
        return max(1.0, ranks / self.parallel_ranks)

    def link(self, span: int) -> tuple[float, float]:
        """(latency, bandwidth) of a group of ``span`` consecutive ranks: a node's links if it
        fits on one, else the slower links between nodes (its busiest rank uses them)."""
        if span <= self.ranks_per_node:
            return self.latency_s, self.bandwidth_b_s
        return (
            self.inter_node_latency_s if self.inter_node_latency_s is not None else self.latency_s,
            self.inter_node_bandwidth_b_s if self.inter_node_bandwidth_b_s is not None else self.bandwidth_b_s,
        )

    def attention_flop_s(self, window: int | None) -> float:
        """The attention kernel's useful FLOP/s at ``window`` (None: global)."""
        if window is None:
            return self.global_attention_flop_s
        curve = [tuple(point) for point in self.window_attention_curve]
        if not curve:
            return self.window_attention_flop_s
        if window <= curve[0][0]:
            return curve[0][1]
        for (w0, r0), (w1, r1) in zip(curve, curve[1:]):
            if window <= w1:
                t = math.log(window / w0) / math.log(w1 / w0)
                return r0 + t * (r1 - r0)
        return curve[-1][1]

    def memory_per_rank(self, ranks: int) -> float:
        return self.memory_b / min(ranks, self.ranks_per_node) if self.shared_memory else self.memory_b


# GPU clusters, from published figures; rates are the peak times an efficiency stated here.
PRESETS: Mapping[str, Machine] = MappingProxyType(
    {
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
            source=(
                "NVIDIA H100 datasheet and DGX H100 guide; FlashAttention-3 (arXiv:2407.08608); efficiencies assumed"
            ),
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
)
