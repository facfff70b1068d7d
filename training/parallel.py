"""Data-parallel x model-parallel ranks on a device mesh with named axes, passed explicitly.

World ranks are laid out model-parallel-fastest: ranks ``[d * mp, (d + 1) * mp)`` form
model replica ``d`` (the mesh's ``mp`` axis); ranks with the same ``mp_rank`` form a
data-parallel group (its ``dp`` axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from processor.distributed import parallelize_gradients


@dataclass(frozen=True)
class ParallelDims:
    world: int
    mp: int
    rank: int
    mesh: DeviceMesh | None  # axes ("dp", "mp"); None on one rank
    mp_group: dist.ProcessGroup | None  # the mesh's "mp" group; None with one rank per model

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
        """Build the mesh (every rank must call this); on CUDA devices under NCCL, else CPU."""
        if not dist.is_initialized():
            if ranks_per_model != 1:
                raise ValueError(f"ranks_per_model = {ranks_per_model} needs a process group; none is initialised")
            return cls(1, 1, 0, None, None)
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % ranks_per_model:
            raise ValueError(f"ranks_per_model = {ranks_per_model} does not divide the world size {world}")
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        mesh = init_device_mesh(device_type, (world // ranks_per_model, ranks_per_model), mesh_dim_names=("dp", "mp"))
        return cls(world, ranks_per_model, rank, mesh, mesh["mp"].get_group() if ranks_per_model > 1 else None)

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The mesh's "dp" group (this rank and its peers in the other replicas); None with one replica."""
        return None if self.mesh is None or self.dp == 1 else self.mesh["dp"].get_group()

    def parallelize(self, model: nn.Module) -> nn.Module:
        """``model`` with gradients summed over ``mp`` and averaged over ``dp`` in backward."""
        return model if self.mesh is None else parallelize_gradients(model, self.mesh)

    def sum_over_world(self, values: list[float]) -> list[float]:
        """Sum a few numbers over every rank (for logging losses)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()
