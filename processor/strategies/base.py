"""What a model-parallel strategy is: the sequence-mixing half of self-attention.

Projections and norms are per point and run wherever the point lives; only attention
mixes points, so a strategy decides how queries meet the keys held by other ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch.distributed as dist
from torch import Tensor

from processor.distributed.shards import ShardLayout

if TYPE_CHECKING:
    from processor.attention.module import SelfAttention


@dataclass(frozen=True)
class ShardContext:
    """The model-parallel group and this rank's block of points, passed down every layer."""

    group: dist.ProcessGroup | None
    layout: ShardLayout

    @property
    def world_size(self) -> int:
        return self.layout.world_size


class Strategy(Protocol):
    name: str

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        """Raise ``ValueError`` if this strategy cannot run the configuration on ``world_size`` ranks."""

    def attend(self, attn: SelfAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` normed input -> ``(batch, local_points, channels)``
        attention output for the local points, before the output projection."""
