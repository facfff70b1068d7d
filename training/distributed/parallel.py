"""Data-parallel x model-parallel ranks on a device mesh with named axes, passed explicitly.

The mesh has axes ``("dp", "mp")``: row ``d`` holds the ranks of model replica ``d`` (its
``mp`` group), column ``m`` the ranks that hold the same shard in every replica (a ``dp``
group). Which ranks share a row follows the nodes they run on
(:mod:`processor.runtime.placement`): by default a model group is kept inside one node, so
on one node (or ``ranks_per_model`` dividing each node's ranks) replica ``d`` is the ranks
``[d * mp, (d + 1) * mp)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from processor.distributed import parallelize_gradients
from processor.distributed.transport import collective_device
from processor.runtime.placement import describe_layout, gather_nodes, model_groups, this_node

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelDims:
    world: int
    mp: int
    rank: int
    mesh: DeviceMesh | None  # axes ("dp", "mp"); None on one rank
    mp_group: dist.ProcessGroup | None  # the mesh's "mp" group; None with one rank per model
    dp_rank: int = 0  # this rank's model replica (its row of the mesh)
    mp_rank: int = 0  # this rank's place in its model group (its shard)
    nodes: list[str] = field(default_factory=list)  # the node of every world rank

    @property
    def dp(self) -> int:
        return self.world // self.mp

    @classmethod
    def build(cls, ranks_per_model: int, placement: str = "within_nodes") -> ParallelDims:
        """Build the mesh (every rank must call this; one ``all_gather_object`` of the nodes);
        on CUDA devices under NCCL, else CPU. ``placement``: see :mod:`processor.runtime.placement`."""
        if not dist.is_initialized():
            if ranks_per_model != 1:
                raise ValueError(f"ranks_per_model = {ranks_per_model} needs a process group; none is initialised")
            return cls(1, 1, 0, None, None, nodes=[this_node()])
        world, rank = dist.get_world_size(), dist.get_rank()
        nodes = gather_nodes()
        groups = model_groups(nodes, ranks_per_model, placement)
        if rank == 0:
            log.info("layout: %s", describe_layout(nodes, groups, placement))
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        mesh = DeviceMesh(device_type, torch.tensor(groups), mesh_dim_names=("dp", "mp"))
        dp_rank, mp_rank = mesh.get_coordinate()
        mp_group = mesh["mp"].get_group() if ranks_per_model > 1 else None
        if mp_group is not None and dist.get_rank(mp_group) != mp_rank:  # the shard order is the group's
            raise RuntimeError(f"rank {rank}: mesh coordinate {mp_rank} is not its model-group rank")
        return cls(world, ranks_per_model, rank, mesh, mp_group, dp_rank, mp_rank, nodes)

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The mesh's "dp" group (this rank and its peers in the other replicas); None with one replica."""
        return None if self.mesh is None or self.dp == 1 else self.mesh["dp"].get_group()

    def parallelize(self, model: nn.Module) -> nn.Module:
        """``model`` with gradients summed over ``mp`` and averaged over ``dp`` in backward."""
        return model if self.mesh is None else parallelize_gradients(model, self.mesh)

    def sum_over_world(self, values: list[float]) -> list[float]:
        """Sum a few numbers over every rank (for logging losses)."""
        return self._over_world(values, dist.ReduceOp.SUM)

    def max_over_world(self, values: list[float]) -> list[float]:
        """The largest of a few numbers over every rank (peak memories)."""
        return self._over_world(values, dist.ReduceOp.MAX)

    def mean_over_world(self, values: list[float]) -> list[float]:
        """The mean of a few numbers over every rank (a profiled step's shares)."""
        return [v / self.world for v in self.sum_over_world(values)]

    def _over_world(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        if self.world == 1:
            return [float(v) for v in values]
        t = torch.tensor(values, dtype=torch.float64, device=collective_device(None))
        dist.all_reduce(t, op=op)
        return t.tolist()
