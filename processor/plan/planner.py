"""A cost model of one processor step per strategy, and the pick of ``strategy=auto``.

``predict(workload, strategy, machine)`` adds, for the busiest rank of one forward+backward,
what the strategy states about itself (:class:`~processor.strategies.cost.StrategyCost`):

- **compute**: the useful FLOPs of :mod:`processor.plan.flops` that land on this rank (the
  strategy's share of the points, or of the heads, or both), plus the strategy's extra
  projections (the halo rows' k, v) and the recomputation under checkpointing, at the
  machine's GEMM rate (projections, MLP) and its attention kernel's rate (windowed or
  global), and the memory-bound work and copies beside them. Ranks sharing cores run slower
  in proportion.
- **communication**: the strategy's bytes at the link's bandwidth plus one latency per
  message; parts the strategy posts before the attention they feed (the halo, the ring) cost
  only what the attention does not hide; the others sit on the critical path.
- **memory**: the activations autograd keeps (:func:`processor.plan.flops.saved_activation_bytes`)
  plus parameters, gradients and Adam's two moments (the strategy's share of them).

:func:`choose` predicts every strategy (and setting) that can run the workload, the built-in
ones and any given, drops those that do not fit the memory, and picks the fastest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from processor.config import ConfigError, ProcessorConfig, mlp_hidden_channels
from processor.plan.flops import saved_activation_bytes, window_pairs
from processor.plan.machine import Machine
from processor.strategies import BUILT_IN, SingleRank, Strategy
from processor.strategies.cost import Workload


@dataclass(frozen=True)
class Prediction:
    strategy: Strategy
    step_s: float
    compute_s: float
    comm_s: float  # all of it, hidden or not
    exposed_comm_s: float  # what the step waits for
    bytes_sent: int  # by the busiest rank
    memory_b: int  # per rank
    fits: bool

    @property
    def label(self) -> str:
        return self.strategy.label


def processor_bytes(strategy: Strategy, work: Workload, sizes: list[int], rank: int) -> int:
    """Bytes ``rank`` sends in one forward+backward of the processor split over ``sizes``."""
    return 0 if len(sizes) == 1 else strategy.processor_bytes(work, sizes, rank)


def segment_id_bytes(strategy: Strategy, work: Workload, sizes: list[int], rank: int) -> int:
    """Bytes ``rank`` sends to share the segment ids once per forward."""
    return 0 if len(sizes) == 1 else strategy.segment_id_bytes(work, sizes, rank)


def candidates(work: Workload, strategies: Iterable[type[Strategy]] = ()) -> list[Strategy]:
    """Every setting of the built-in strategies, then of ``strategies``, that can run ``work``
    on its ranks (on one rank: the single-rank path, whatever the strategy)."""
    if work.ranks == 1:
        return [SingleRank()]
    kinds = [*BUILT_IN.values(), *(s for s in strategies if s not in BUILT_IN.values())]
    found = [s for kind in kinds for s in kind.planner_candidates(work.num_heads, work.ranks)]
    return [s for s in found if _runs(work, s)]


def _runs(work: Workload, strategy: Strategy) -> bool:
    try:
        config = ProcessorConfig(
            num_layers=work.num_layers,
            num_channels=work.num_channels,
            num_heads=work.num_heads,
            window_size=work.window_size,
            strategy=strategy,
        )
        config.check_world_size(work.ranks)
    except (ConfigError, ValueError):
        return False
    return True


def predict(work: Workload, strategy: Strategy, machine: Machine) -> Prediction:
    """The step time, bytes and memory of the busiest rank under ``strategy`` on ``machine``."""
    p = work.ranks
    if p == 1:
        strategy = SingleRank()
    sizes = work.sizes
    attention = _attention_s(work, strategy, machine)
    compute = _outside_attention_s(work, strategy, sizes, machine) + attention
    sent = max(processor_bytes(strategy, work, sizes, r) for r in range(p)) if p > 1 else 0
    comm = exposed = 0.0
    for part in strategy.comm_parts(work, sizes, sent) if p > 1 else []:
        latency, bandwidth = machine.link(part.span)
        t = part.messages * latency + part.bytes / bandwidth
        comm += t
        exposed += max(0.0, t - attention) if part.overlapped else t  # hidden behind attention
    memory = _memory_b(work, strategy)
    fits = memory <= machine.memory_per_rank(p)
    return Prediction(strategy, compute + exposed, compute, comm, exposed, sent, memory, fits)


def choose(
    work: Workload, machine: Machine, strategies: Iterable[type[Strategy]] = ()
) -> tuple[Prediction, list[Prediction]]:
    """The fastest candidate (:func:`candidates`) that fits, and every candidate's prediction
    (fastest first). A candidate that does not state its cost is left out."""
    table = []
    for strategy in candidates(work, strategies):
        try:
            table.append(predict(work, strategy, machine))
        except NotImplementedError:
            continue
    table.sort(key=lambda x: (not x.fits, x.step_s))
    if not table[0].fits:
        raise ValueError(
            f"no strategy fits {work.points} points in {machine.memory_b / 2**30:.1f} GiB per rank on "
            f"{work.ranks} ranks (least: {table[0].memory_b / 2**30:.1f} GiB); use more ranks or checkpointing"
        )
    return table[0], table


def _attention_s(work: Workload, strategy: Strategy, machine: Machine) -> float:
    points, heads = strategy.work_share(work) if work.ranks > 1 else (1.0, 1.0)
    flops = 3 * work.batch * work.num_layers * 4 * work.num_channels * window_pairs(work.points, work.window_size)
    flops *= points * heads * (4 / 3 if work.num_chunks > 0 else 1)
    rate = machine.attention_flop_s(work.window_size)
    return flops / rate * machine.slowdown(work.ranks)


def _outside_attention_s(work: Workload, strategy: Strategy, sizes: list[int], machine: Machine) -> float:
    """Projections and MLP at the GEMM rate, and the memory-bound work beside them."""
    ch = work.num_channels
    hidden = mlp_hidden_channels(ch, work.mlp_hidden_ratio)
    rows = max(sizes)  # point-sharded strategies: my rows; shard_channels: all rows, a share of the channels
    dense = 2 * rows * ch * 4 * ch + 4 * rows * ch * hidden
    copies = 0.0
    if work.ranks > 1:
        dense += strategy.extra_projection_flops(work, sizes)
        copies = strategy.copies_per_value(work)
    recompute = 4 / 3 if work.num_chunks > 0 else 1
    dense *= 3 * work.batch * work.num_layers * recompute
    values = work.batch * work.num_layers * recompute * rows * ch
    memory_bound = values * (machine.other_s_per_value + copies * machine.copy_s_per_value)
    return (dense / machine.gemm_flop_s + memory_bound) * machine.slowdown(work.ranks)


def _memory_b(work: Workload, strategy: Strategy) -> int:
    """Activations kept for backward, parameters, their gradients and Adam's moments (fp32)."""
    ch = work.num_channels
    hidden = mlp_hidden_channels(ch, work.mlp_hidden_ratio)
    params = work.num_layers * (4 * ch * ch + 2 * ch * hidden + 9 * ch)
    if work.ranks > 1:
        params //= strategy.parameter_divisor(work.ranks)
    return saved_activation_bytes(work, strategy) + 4 * 4 * params
