"""Data-parallel x model-parallel process groups, named and passed explicitly.

World ranks are laid out model-parallel-fastest: ranks ``[d * mp, (d + 1) * mp)`` form
model replica ``d``; ranks with the same ``mp_rank`` form a data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from processor.distributed import all_reduce_gradients, sum_model_parallel_gradients


@dataclass(frozen=True)
class ParallelDims:
    world: int
    mp: int
    rank: int
    mp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None

    @property
    def dp(self) -> int:
        return self.world // self.mp

    @property
    def mp_rank(self) -> int:
        return self.rank % self.mp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.mp

    @classmethod
    def build(cls, ranks_per_model: int) -> ParallelDims:
        """Create the groups (every rank must call this, in the same order)."""
        if not dist.is_initialized():
            if ranks_per_model != 1:
                raise ValueError(f"ranks_per_model = {ranks_per_model} needs a process group; none is initialised")
            return cls(1, 1, 0, None, None)
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % ranks_per_model:
            raise ValueError(f"ranks_per_model = {ranks_per_model} does not divide the world size {world}")
        mp_group = dp_group = None
        for d in range(world // ranks_per_model):
            g = dist.new_group(list(range(d * ranks_per_model, (d + 1) * ranks_per_model)))
            if d == rank // ranks_per_model:
                mp_group = g
        for m in range(ranks_per_model):
            g = dist.new_group(list(range(m, world, ranks_per_model)))
            if m == rank % ranks_per_model:
                dp_group = g
        return cls(world, ranks_per_model, rank, mp_group if ranks_per_model > 1 else None, dp_group)

    def reduce_gradients(self, model: nn.Module) -> None:
        """Sum over the model-parallel group (each rank has its points' part), then average over
        the data-parallel replicas. No scaling by the model-parallel size anywhere."""
        params = [p for p in model.parameters() if p.requires_grad]
        sum_model_parallel_gradients(params, self.mp_group)
        all_reduce_gradients(params, self.dp_group, divide_by=self.dp)

    def sum_over_world(self, values: list[float]) -> list[float]:
        """Sum a few numbers over every rank (for logging losses)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()
