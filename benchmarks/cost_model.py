"""A cost model of one processor step per strategy: compute, communication and memory per rank.

``predict(workload, candidate, machine)`` adds, for the busiest rank of one forward+backward:

- **compute**: the useful FLOPs of :mod:`benchmarks.flops` that land on this rank (its share
  of the points, or of the heads, or both), plus the halo rows' k, v projections and the
  recomputation under checkpointing, at the machine's GEMM rate (projections, MLP) and its
  attention kernel's rate (windowed or global). Ranks sharing cores run slower in proportion.
- **communication**: the bytes :mod:`benchmarks.analytic` counts for the strategy, at the
  link's bandwidth, plus one latency per message. The halo and the ring are posted before
  the attention they feed (see ``shard_sequence``), so they cost only what the attention
  does not hide; all-to-alls and the tensor-parallel collectives sit on the critical path.
- **memory**: the activations autograd keeps (:func:`benchmarks.flops.saved_activation_bytes`)
  plus parameters, gradients and Adam's two moments (a share of them for ``shard_channels``).

:func:`choose` predicts every strategy (and knob) that can run the configuration, drops the
ones that do not fit the memory, and picks the fastest. The machine is measured here by a
short probe (:mod:`benchmarks.machine_probe`) or given (:data:`benchmarks.machine_probe.PRESETS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks.analytic import (
    exchanged_element_size,
    hybrid_group_size,
    processor_bytes,
    ring_partners,
    sequence_uses_ring,
)
from benchmarks.flops import saved_activation_bytes, window_pairs
from processor.config import ConfigError, ProcessorConfig, mlp_hidden_channels
from processor.distributed.hybrid_groups import divisors, super_blocks
from processor.distributed.shards import shard_sizes


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


@dataclass(frozen=True)
class Workload:
    """One processor configuration: its points, model settings and how it runs."""

    points: int
    num_layers: int
    num_channels: int
    num_heads: int
    window_size: int | None
    mlp_hidden_ratio: float = 2.0
    num_chunks: int = 0
    batch: int = 1
    ranks: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast): what the exchanged values are

    @classmethod
    def of(cls, points: int, model: Mapping[str, Any], batch: int, ranks: int, precision: str) -> Workload:
        """From a model section (``num_layers``, ``num_channels``, ... as the configs name them)."""
        keys = ("num_layers", "num_channels", "num_heads", "window_size", "mlp_hidden_ratio", "num_chunks")
        return cls(points, *(model[k] for k in keys), batch, ranks, precision)

    @classmethod
    def from_benchmark(cls, cfg: Mapping[str, Any]) -> Workload:
        """From a ``python -m benchmarks`` point's resolved config."""
        from processor.grids import grid_points

        return cls.of(grid_points(cfg["grid"]), cfg["model"], cfg["batch_size"], cfg["ranks"], cfg["precision"])

    def model(self) -> dict[str, Any]:
        return dict(
            num_layers=self.num_layers,
            num_channels=self.num_channels,
            num_heads=self.num_heads,
            window_size=self.window_size,
            mlp_hidden_ratio=self.mlp_hidden_ratio,
            num_chunks=self.num_chunks,
        )


@dataclass(frozen=True)
class Candidate:
    """A strategy and its options, as ``strategy=... strategy.<option>=...`` would set them."""

    strategy: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.strategy}({opts})" if opts else self.strategy


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    step_s: float
    compute_s: float
    comm_s: float  # all of it, hidden or not
    exposed_comm_s: float  # what the step waits for
    bytes_sent: int  # by the busiest rank
    memory_b: int  # per rank
    fits: bool


def candidates(work: Workload) -> list[Candidate]:
    """Every strategy and knob that can run ``work`` on its ranks (``none`` on one rank)."""
    p = work.ranks
    if p == 1:
        return [Candidate("none")]
    found = [Candidate("shard_sequence"), Candidate("shard_heads"), Candidate("shard_channels")]
    found += [Candidate("shard_hybrid", {"head_group_size": g}) for g in divisors(p) if 1 < g < p]
    return [c for c in found if _runs(work, c)]


def _runs(work: Workload, c: Candidate) -> bool:
    from processor.strategies import resolve_strategy

    try:
        config = ProcessorConfig(
            num_layers=work.num_layers,
            num_channels=work.num_channels,
            num_heads=work.num_heads,
            window_size=work.window_size,
            strategy=resolve_strategy(c.strategy, c.options),
        )
        config.check_world_size(work.ranks)
    except (ConfigError, ValueError):
        return False
    return True


def predict(work: Workload, c: Candidate, machine: Machine) -> Prediction:
    """The step time, bytes and memory of the busiest rank under ``c`` on ``machine``."""
    n, p = work.points, work.ranks
    sizes = shard_sizes(n, p)
    attention = _attention_s(work, c, sizes, machine)
    compute = _outside_attention_s(work, c, sizes, machine) + attention
    sent = max(_bytes(work, c, sizes, r) for r in range(p)) if p > 1 else 0
    comm = exposed = 0.0
    for part_bytes, messages, span, overlapped in _comm_parts(work, c, sizes, sent):
        latency, bandwidth = machine.link(span)
        t = messages * latency + part_bytes / bandwidth
        comm += t
        exposed += max(0.0, t - attention) if overlapped else t  # the halo and ring hide behind attention
    memory = _memory_b(work, c)
    fits = memory <= machine.memory_per_rank(p)
    return Prediction(c, compute + exposed, compute, comm, exposed, sent, memory, fits)


def choose(work: Workload, machine: Machine) -> tuple[Prediction, list[Prediction]]:
    """The fastest candidate that fits, and every candidate's prediction (fastest first)."""
    table = sorted((predict(work, c, machine) for c in candidates(work)), key=lambda x: (not x.fits, x.step_s))
    if not table[0].fits:
        raise ValueError(
            f"no strategy fits {work.points} points in {machine.memory_b / 2**30:.1f} GiB per rank on "
            f"{work.ranks} ranks (least: {table[0].memory_b / 2**30:.1f} GiB); use more ranks or checkpointing"
        )
    return table[0], table


def _heads_share(work: Workload, c: Candidate) -> tuple[float, float]:
    """(share of the points, share of the heads) the busiest rank attends for."""
    n, p, h = work.points, work.ranks, work.num_heads
    if p == 1:
        return 1.0, 1.0
    if c.strategy == "shard_sequence":
        return max(shard_sizes(n, p)) / n, 1.0
    if c.strategy in ("shard_heads", "shard_channels"):
        return 1.0, max(shard_sizes(h, p)) / h
    g = hybrid_group_size(h, p, c.options.get("head_group_size"))
    return max(shard_sizes(n, p // g)) / n, max(shard_sizes(h, g)) / h


def _attention_s(work: Workload, c: Candidate, sizes: list[int], machine: Machine) -> float:
    points, heads = _heads_share(work, c)
    flops = 3 * work.batch * work.num_layers * 4 * work.num_channels * window_pairs(work.points, work.window_size)
    flops *= points * heads * (4 / 3 if work.num_chunks > 0 else 1)
    rate = machine.attention_flop_s(work.window_size)
    return flops / rate * machine.slowdown(work.ranks)


def _outside_attention_s(work: Workload, c: Candidate, sizes: list[int], machine: Machine) -> float:
    """Projections and MLP at the GEMM rate, and the memory-bound work beside them."""
    n, ch = work.points, work.num_channels
    hidden = mlp_hidden_channels(ch, work.mlp_hidden_ratio)
    rows = max(sizes)  # point-sharded strategies: my rows; shard_channels: all rows, a share of the channels
    dense = 2 * rows * ch * 4 * ch + 4 * rows * ch * hidden
    if c.strategy == "shard_sequence" and not sequence_uses_ring(sizes, work.window_size):
        dense += 2 * 2 * min(work.window_size or n, n) * 2 * ch * ch  # k, v of the 2W halo rows
    recompute = 4 / 3 if work.num_chunks > 0 else 1
    dense *= 3 * work.batch * work.num_layers * recompute
    values = work.batch * work.num_layers * recompute * rows * ch
    memory_bound = values * (machine.other_s_per_value + _copies_per_value(work, c) * machine.copy_s_per_value)
    return (dense / machine.gemm_flop_s + memory_bound) * machine.slowdown(work.ranks)


def _copies_per_value(work: Workload, c: Candidate) -> float:
    """Extra copies of each of a rank's (point, channel) values per layer, forward+backward:
    the all-to-alls rearrange q, k, v (3 C) and the output (C) on both sides, both ways; the
    tensor-parallel gathers and reduce-scatters move P times a rank's rows, four of each."""
    p = work.ranks
    if p == 1 or c.strategy == "shard_sequence":
        return 0.0
    if c.strategy == "shard_heads":
        return 16.0
    if c.strategy == "shard_channels":
        return 8.0 * p
    return 16.0 + 8.0  # shard_hybrid: its all-to-all, and k, v joined, padded and split again


def _bytes(work: Workload, c: Candidate, sizes: list[int], rank: int) -> int:
    return processor_bytes(
        c.strategy,
        sizes,
        rank,
        num_layers=work.num_layers,
        num_heads=work.num_heads,
        window_size=work.window_size,
        row_bytes=work.batch * work.num_channels * exchanged_element_size(work.precision),
        checkpointed=work.num_chunks > 0,
        chunks=max(work.num_chunks, 1),
        **c.options,
    )


def _comm_parts(work: Workload, c: Candidate, sizes: list[int], sent: int) -> list[tuple[int, int, int, bool]]:
    """The step's communication of the busiest rank as ``(bytes, messages, span of ranks,
    overlapped with attention)`` parts."""
    p, passes = work.ranks, 2 if work.num_chunks > 0 else 1
    layers = work.num_layers
    if p == 1:
        return []
    if c.strategy == "shard_heads":
        return [(sent, layers * (2 * passes + 2) * (p - 1), p, False)]
    if c.strategy == "shard_channels":
        return [(sent, layers * (4 * passes + 4) * (p - 1), p, False)]
    if c.strategy == "shard_sequence":
        return [(sent, layers * _sequence_messages(sizes, work.window_size, passes), p, True)]
    g = hybrid_group_size(work.num_heads, p, c.options.get("head_group_size"))
    supers = super_blocks(sizes, g)
    within = max(_bytes(work, Candidate("shard_heads"), sizes[:g], r) for r in range(g)) if g > 1 else 0
    return [
        (within, layers * (2 * passes + 2) * (g - 1), g, False),
        (max(sent - within, 0), layers * _sequence_messages(supers, work.window_size, passes), p, True),
    ]


def _sequence_messages(sizes: list[int], window: int | None, passes: int) -> int:
    """Messages per layer of the halo (to both neighbours, forward and backward) or the ring."""
    if len(sizes) == 1:
        return 0
    if sequence_uses_ring(sizes, window):
        return (passes + 2) * max(len(ring_partners(sizes, r, window)) for r in range(len(sizes)))
    return (passes + 1) * 2


def _memory_b(work: Workload, c: Candidate) -> int:
    """Activations kept for backward, parameters, their gradients and Adam's moments (fp32)."""
    ch = work.num_channels
    hidden = mlp_hidden_channels(ch, work.mlp_hidden_ratio)
    params = work.num_layers * (4 * ch * ch + 2 * ch * hidden + 9 * ch)
    if c.strategy == "shard_channels" and work.ranks > 1:
        params //= work.ranks
    saved = saved_activation_bytes(
        work.points, work.ranks, work.model(), work.batch, c.strategy, None, c.options.get("head_group_size")
    )
    return saved + 4 * 4 * params
