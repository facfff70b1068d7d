"""The model-parallel group as a mesh of ranks on named axes, as torchtitan's ``ParallelDims``.

A strategy spreads a layer over up to three axes of the model-parallel group, each with a
degree (:class:`ModelDims`): ``points`` (blocks of the sequence), ``heads`` (attention heads)
and ``channels`` (heads and MLP hidden channels, with their parameters). The product of the
degrees is the group's size; data parallelism (``dp``) lies outside the group.

Ranks are laid out heads fastest, then channels, then points: rank
``r = (p * channels + c) * heads + h``. Consecutive ranks share a node under ``torchrun``'s
numbering, so the heads' all-to-all stays on a node's fast links while the points axis spans
nodes. A rank's group along an axis is the ranks that differ from it only on that axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

AXES = ("points", "channels", "heads")  # outermost first; heads vary fastest


@dataclass(frozen=True)
class ModelDims:
    """Degrees of the model-parallel group on its named axes (1: not split on that axis)."""

    points: int = 1
    channels: int = 1
    heads: int = 1

    @property
    def size(self) -> int:
        """Ranks the mesh holds: the product of the degrees."""
        return self.points * self.channels * self.heads

    @property
    def split_axes(self) -> tuple[str, ...]:
        """The axes with a degree above 1, outermost first."""
        return tuple(axis for axis in AXES if getattr(self, axis) > 1)

    def coordinate(self, rank: int, axis: str) -> int:
        """Rank ``rank``'s index along ``axis``."""
        inner = 1
        for name in reversed(AXES):
            if name == axis:
                return rank // inner % getattr(self, name)
            inner *= getattr(self, name)
        raise ValueError(f"unknown mesh axis {axis!r}; the axes are {list(AXES)}")

    def axis_members(self, rank: int, axis: str) -> list[int]:
        """The ranks (of the group) that differ from ``rank`` only along ``axis``, in order."""
        stride = 1
        for name in reversed(AXES):
            if name == axis:
                break
            stride *= getattr(self, name)
        first = rank - self.coordinate(rank, axis) * stride
        return [first + i * stride for i in range(getattr(self, axis))]

    def describe(self) -> str:
        return " x ".join(f"{axis} {getattr(self, axis)}" for axis in AXES)


@dataclass(frozen=True)
class ModelMesh:
    """The model-parallel ``group``, its degrees, and this rank's group along each split axis.

    Build it once per run with :meth:`build` (or :meth:`processor.TransformerProcessor.build_groups`)
    and pass it where the processor takes its group. A mesh split on one axis needs no groups of
    its own: that axis's group is ``group``.
    """

    group: dist.ProcessGroup
    dims: ModelDims
    axis_groups: dict[str, dist.ProcessGroup] = field(default_factory=dict)

    @classmethod
    def build(cls, group: dist.ProcessGroup, dims: ModelDims) -> ModelMesh:
        """The mesh of ``group`` with degrees ``dims``. When ``dims`` splits more than one axis,
        every rank of the *world* calls this, together, each with its own model-parallel group
        (``dist.new_group`` is collective over the world); otherwise nothing is exchanged.

        Raises:
            ValueError: when the degrees do not multiply to the group's size.
        """
        world = dist.get_world_size(group)
        if dims.size != world:
            raise ValueError(f"the mesh's degrees ({dims.describe()}) hold {dims.size} ranks, the group has {world}")
        split = dims.split_axes
        if len(split) <= 1:
            return cls(group, dims, {axis: group for axis in split})
        members = tuple(dist.get_global_rank(group, r) for r in range(world))
        if list(members) != sorted(members):
            raise ValueError(f"a model mesh needs the model-parallel ranks in increasing order, got {members}")
        everyone: list[tuple[tuple[int, ...], ModelDims] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (members, dims))
        if any(other[1] != dims for other in everyone):  # type: ignore[index]
            raise ValueError(f"ranks disagree on the mesh's degrees: {sorted({o[1].describe() for o in everyone})}")  # type: ignore[index]
        replicas = sorted({other[0] for other in everyone})  # type: ignore[index]
        me, rank = members[dist.get_rank(group)], dist.get_rank(group)
        axis_groups = {}
        for axis in split:
            every_group = [
                tuple(replica[r] for r in dims.axis_members(first, axis))
                for replica in replicas
                for first in range(world)
                if dims.coordinate(first, axis) == 0
            ]
            axis_groups[axis] = _create_mine(every_group, me)
        assert all(me in [members[r] for r in dims.axis_members(rank, axis)] for axis in split)
        return cls(group, dims, axis_groups)

    def axis_group(self, axis: str) -> dist.ProcessGroup | None:
        """This rank's group along ``axis``; None when the mesh is not split along it (a
        degree of 1: nothing to exchange there)."""
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; the axes are {list(AXES)}")
        return self.axis_groups.get(axis)

    def coordinate(self, axis: str) -> int:
        """This rank's index along ``axis``."""
        return self.dims.coordinate(dist.get_rank(self.group), axis)


def super_blocks(sizes: list[int] | tuple[int, ...], g: int) -> list[int]:
    """Points per group of ``g`` consecutive ranks: the sum of each ``g`` consecutive blocks."""
    return [sum(sizes[s * g : (s + 1) * g]) for s in range(len(sizes) // g)]


def divisors(n: int) -> list[int]:
    """Every ``g`` with ``n % g == 0``, ascending."""
    return [g for g in range(1, n + 1) if n % g == 0]


def _create_mine(all_groups: list[tuple[int, ...]], me: int) -> dist.ProcessGroup:
    """Create every group of global ranks in ``all_groups`` (every world rank, in the same
    order) and return the one holding global rank ``me``."""
    mine = None
    for ranks in all_groups:
        created = dist.new_group(list(ranks))
        if me in ranks:
            mine = created
    assert mine is not None
    return mine


# What the processor takes as its model-parallel group.
GroupLike = dist.ProcessGroup | DeviceMesh | ModelMesh | None


def process_group_of(group: GroupLike) -> dist.ProcessGroup | None:
    """The model-parallel process group of ``group`` (a 1-D mesh's, or a model mesh's ``group``)."""
    if isinstance(group, ModelMesh):
        return group.group
    if not isinstance(group, DeviceMesh):
        return group
    if group.ndim != 1:
        raise ValueError(
            f"the processor takes a 1-D mesh of its model-parallel ranks; got dims {group.mesh_dim_names}: "
            'pass the axis, e.g. mesh["mp"]'
        )
    return group.get_group()
