"""The model-parallel group as a 2-D grid of ranks: head groups by sequence groups.

With head groups of ``G`` ranks, the ``P`` ranks of the model-parallel group are laid out
heads-fastest: rank ``r`` has head index ``r % G`` and sequence index ``r // G``.

- Its **head group** is the ``G`` consecutive ranks ``[G * (r // G), G * (r // G) + G)``;
  between them they hold one contiguous *super-block* of points.
- Its **sequence group** is the ``P / G`` ranks with the same head index, one per super-block.

Consecutive ranks share a node under ``torchrun``'s numbering, so the head group's
all-to-all stays on a node's fast links while the sequence group spans nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class HybridGroups:
    """The model-parallel ``group`` and this rank's two sub-groups of it.

    Build it once per run with :meth:`build` (or :meth:`processor.TransformerProcessor.build_groups`)
    and pass it where the processor takes its group.
    """

    group: dist.ProcessGroup  # every model-parallel rank
    heads: dist.ProcessGroup | None  # this rank's head group (``group`` when G = P; None when G = 1)
    sequence: dist.ProcessGroup | None  # this rank's sequence group (``group`` when G = 1; None when G = P)
    head_group_size: int

    @classmethod
    def build(cls, group: dist.ProcessGroup, head_group_size: int) -> HybridGroups:
        """Create the sub-groups of ``group``. Every rank of the *world* calls this, together,
        each with its own model-parallel group (``dist.new_group`` is collective over the
        world); with ``G = 1`` or ``G = P`` no group is created and nothing is exchanged.

        Raises:
            ValueError: naming ``head_group_size`` if it does not divide the group's size.
        """
        world, rank, g = dist.get_world_size(group), dist.get_rank(group), head_group_size
        if g < 1 or world % g:
            raise ValueError(
                f"head_group_size = {g} does not divide the {world} model-parallel ranks; choose one of "
                f"{divisors(world)}"
            )
        if g in (1, world):
            return cls(group, None if g == 1 else group, None if g == world else group, g)
        members = tuple(dist.get_global_rank(group, r) for r in range(world))
        if list(members) != sorted(members):
            raise ValueError(f"HybridGroups.build needs the model-parallel ranks in increasing order, got {members}")
        everyone: list[tuple[tuple[int, ...], int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (members, g))
        if any(other[1] != g for other in everyone):  # type: ignore[index]
            raise ValueError(f"ranks disagree on head_group_size: {sorted({o[1] for o in everyone})}")  # type: ignore[index]
        replicas = sorted({other[0] for other in everyone})  # type: ignore[index]
        heads = _create_mine([r[i : i + g] for r in replicas for i in range(0, world, g)], members[rank])
        sequence = _create_mine([r[j::g] for r in replicas for j in range(g)], members[rank])
        return cls(group, heads, sequence, g)


def super_blocks(sizes: list[int] | tuple[int, ...], g: int) -> list[int]:
    """Points per head group: the sum of each ``g`` consecutive blocks of ``sizes``."""
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
GroupLike = dist.ProcessGroup | DeviceMesh | HybridGroups | None


def process_group_of(group: GroupLike) -> dist.ProcessGroup | None:
    """The model-parallel process group of ``group`` (a 1-D mesh's, or the groups' ``group``)."""
    if isinstance(group, HybridGroups):
        return group.group
    if not isinstance(group, DeviceMesh):
        return group
    if group.ndim != 1:
        raise ValueError(
            f"the processor takes a 1-D mesh of its model-parallel ranks; got dims {group.mesh_dim_names}: "
            'pass the axis, e.g. mesh["mp"]'
        )
    return group.get_group()
