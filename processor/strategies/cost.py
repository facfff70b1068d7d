"""What a strategy costs: the questions the planner asks every strategy (:class:`StrategyCost`).

A strategy states, for a :class:`Workload` split over ``sizes`` points per model-parallel rank,
the bytes a rank sends per layer and step, its messages, its share of the work, the copies it
adds and the activations it keeps; the planner (:mod:`processor.plan`) turns these into a
predicted step time and memory and picks the fastest strategy that fits. The formulas of the
communication patterns live in :mod:`processor.strategies.traffic`. Every method is asked
only for a group of more than one rank.

A strategy of your own answers these too (see ``tests/processor/plan/test_own_strategy.py``),
and is then counted, swept and chosen by ``strategy=auto`` like the built-ins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from processor.distributed.shards import shard_sizes
from processor.strategies.traffic import exchanged_element_size, gathered_rows


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
    activation: str = "gelu"  # the MLP's: decides what its backward keeps
    attn_channels: int | None = None  # the attention's width A (None: num_channels)

    @classmethod
    def of(cls, points: int, model: Any, batch: int, ranks: int, precision: str) -> Workload:
        """From a model section (an object or mapping with ``num_layers``, ``num_channels``, ...)."""
        keys = ("num_layers", "num_channels", "num_heads", "window_size", "mlp_hidden_ratio", "num_chunks")
        settings = dict(model) if isinstance(model, Mapping) else vars(model)
        activation, attn_channels = settings.get("activation", "gelu"), settings.get("attn_channels")
        values = (settings[k] for k in keys)
        return cls(points, *values, batch, ranks, precision, activation=activation, attn_channels=attn_channels)

    @property
    def sizes(self) -> list[int]:
        """Points per rank, split as the processor splits them (larger blocks first)."""
        return shard_sizes(self.points, self.ranks)

    @property
    def row_bytes(self) -> int:
        """One point's values on the wire: ``batch * channels * element size``."""
        return self.batch * self.num_channels * exchanged_element_size(self.precision)

    @property
    def attention_channels(self) -> int:
        """The attention's width ``A``: q, k, v and the heads' output have ``A`` values a point."""
        return self.attn_channels or self.num_channels

    @property
    def attention_row_bytes(self) -> int:
        """One point's q, k, v or head outputs on the wire: ``batch * A * element size``."""
        return self.batch * self.attention_channels * exchanged_element_size(self.precision)

    @property
    def forward_passes(self) -> int:
        """How often forward's exchanges run per step: twice under activation checkpointing."""
        return 2 if self.num_chunks > 0 else 1

    def model(self) -> dict[str, Any]:
        return dict(
            num_layers=self.num_layers,
            num_channels=self.num_channels,
            num_heads=self.num_heads,
            window_size=self.window_size,
            mlp_hidden_ratio=self.mlp_hidden_ratio,
            num_chunks=self.num_chunks,
            attn_channels=self.attn_channels,
        )


@dataclass(frozen=True)
class CommPart:
    """Part of a step's communication on the busiest rank."""

    bytes: int
    messages: int
    span: int  # consecutive ranks the part's group spans (a node's links, or those between nodes)
    overlapped: bool  # posted before the attention it feeds: only what attention does not hide counts


class StrategyCost:
    """The cost questions, answered by each strategy about itself (``ranks > 1``).

    Work and memory default to a point-sharded strategy that keeps nothing beyond its own
    points' activations; the communication (:meth:`layer_bytes`, :meth:`comm_parts`) has no
    default: a strategy that does not state it is not costed (the planner says so)."""

    name: ClassVar[str]
    splits_parameters: ClassVar[bool]

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        """Bytes ``rank`` sends for one layer in one forward+backward (forward's exchanges
        ``work.forward_passes`` times)."""
        raise NotImplementedError(f"strategy {self.name!r} does not state its bytes (StrategyCost.layer_bytes)")

    def processor_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        """Bytes ``rank`` sends in one forward+backward of the whole processor."""
        return work.num_layers * self.layer_bytes(work, sizes, rank)

    def segment_id_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        """Bytes ``rank`` sends to share the segment ids (int64, once per forward, no backward):
        by default an all-gather."""
        return gathered_rows(sizes) * 8

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        """The step's communication of the busiest rank, which sends ``sent`` bytes in all."""
        raise NotImplementedError(f"strategy {self.name!r} does not state its messages (StrategyCost.comm_parts)")

    def work_share(self, work: Workload) -> tuple[float, float]:
        """(share of the points, share of the heads) the busiest rank attends for."""
        return max(work.sizes) / work.points, 1.0

    def extra_projection_flops(self, work: Workload, sizes: list[int]) -> int:
        """Dense FLOPs per layer and sample in forward beyond the rank's own rows (e.g. the
        halo rows' k and v projections)."""
        return 0

    def copies_per_value(self, work: Workload) -> float:
        """Extra copies of each of a rank's (point, channel) values per layer, forward+backward."""
        return 0.0

    def parameter_divisor(self, ranks: int) -> int:
        """The share of the attention and MLP parameters a rank holds is ``1 / this``."""
        return ranks if self.splits_parameters else 1

    def kept_values_per_layer(self, work: Workload) -> int:
        """Values per layer and sample autograd keeps beyond the rank's own points' activations."""
        return 0

    def decided(self, num_heads: int, ranks: int) -> StrategyCost:
        """This strategy with the options it decides by itself (None) spelled out for
        ``num_heads`` heads on ``ranks`` ranks. Default: itself."""
        return self

    @classmethod
    def planner_candidates(cls, num_heads: int, ranks: int) -> list[StrategyCost]:
        """The settings of this strategy the planner tries on ``ranks`` ranks (each is checked
        to run before it is costed)."""
        return [cls()]

    @property
    def config_name(self) -> str:
        """What a config names this strategy by: a built-in's name, or your own's import path
        (``package.module:ClassName``)."""
        if type(self).__module__.startswith(f"{__package__}."):  # every class here is a built-in
            return self.name
        return f"{type(self).__module__}:{type(self).__qualname__}"

    @property
    def label(self) -> str:
        """The name and the options set, as ``strategy=... strategy.<option>=...`` would set them."""
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options().items()))
        return f"{self.name}({opts})" if opts else self.name

    def options(self) -> dict[str, Any]:
        """The options that are set (not None): a dataclass strategy's fields."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
