"""Learned features of each point of a grid, beside its coordinates (anemoi's ``trainable_size``).

A point's coordinates say where it is; what the data shows of it (its local climate, a coast, a
hill, the land under it) they do not. Each point gets ``size`` parameters, zero at first, that
the embedding reads with its coordinates: the model learns them from the data.

Split with their points: each rank keeps its block of rows (a
:class:`~processor.distributed.parameter_split.ChannelSplit` along the points), so that the
gradient of a row lives on the rank that holds the point, is not summed over the model-parallel
ranks, and checkpoints hold the full tensor (``full_state_dict``), loadable on any rank count.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from processor.distributed import ShardLayout
from processor.distributed.parameter_split import ChannelSplit, split_parameter


class NodeParameters(nn.Module):
    """``weight`` ``(points, size)``: the whole grid's, or this rank's block once :meth:`split`."""

    def __init__(self, points: int, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(points, size))

    def split(self, layout: ShardLayout) -> None:
        """Keep the rows of ``layout``'s block, marked as split (a no-op on one rank or when split)."""
        if layout.world_size > 1 and self.weight.shape[0] == layout.total:
            split_parameter(self, "weight", ChannelSplit(dim=0, sizes=layout.sizes), layout.rank)

    def forward(self, features: Tensor, layout: ShardLayout) -> Tensor:
        """``features`` ``(local points, f)`` of ``layout``'s block -> ``(local points, f + size)``."""
        rows, local = self.weight, layout.sizes[layout.rank]
        if rows.shape[0] != local:
            if rows.shape[0] != layout.total:
                raise ValueError(
                    f"node parameters of {rows.shape[0]} points on a grid of {layout.total} points ({local} on "
                    "this rank): build the forecaster for this grid (model.trainable_size, the grids' sizes)"
                )
            rows = rows[layout.start : layout.stop]
        return torch.cat([features, rows.to(features.dtype)], dim=-1)
