"""``shard_hybrid``: heads within groups of ranks, sequence across them (USP's 2-D design).

The ``P`` model-parallel ranks form a mesh of ``P / G`` points by ``G`` heads
(:class:`~processor.distributed.mesh.ModelMesh`): ``P / G`` head groups of ``G`` consecutive
ranks, each holding one contiguous super-block of points. Per layer:

1. Inside its head group a rank trades its points' q, k, v for "the super-block's points,
   my ``1/G`` of the heads" (``shard_heads``'s all-to-all, over ``G`` ranks).
2. Across head groups, the ranks holding the same heads run ``shard_sequence``'s attention
   over the super-blocks: a halo of k and v from the neighbouring super-blocks, overlapped
   with the interior queries, or ring passes when the window reaches farther.
3. The reverse all-to-all brings the output home.

So the heads limit only ``G``, not ``P``; the all-to-all stays within ``G`` ranks (a node's
fast links); and the sequence part pays one halo per super-block, not one per rank.
``G = P`` is ``shard_heads``, ``G = 1`` is ``shard_sequence`` (with k, v on the wire).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from processor.distributed.halo import HaloConfig, halo_extent, start_halo_exchange
from processor.distributed.mesh import ModelDims, ModelMesh, divisors, super_blocks
from processor.distributed.ring import ring_attention
from processor.distributed.shards import ShardLayout, shard_sizes
from processor.strategies.base import HeadAttention, PointSharded, ShardContext, StrategyOptionError
from processor.strategies.cost import CommPart, Workload
from processor.strategies.shard_heads import ShardHeads, heads_to_points, points_to_heads
from processor.strategies.shard_sequence import ShardSequence, halo_attention
from processor.strategies.traffic import halo_bytes, head_all_to_all_bytes, ring_bytes, sequence_messages, uses_ring

# The default head group stays within a typical node (8 GPUs): all-to-all on NVLink.
DEFAULT_MAX_HEAD_GROUP = 8


@dataclass(frozen=True)
class ShardHybrid(PointSharded):
    """Heads x sequence on a 2-D grid of ranks; runs on any ``P`` with a divisor ``G <= heads``.

    Args:
        head_group_size: ``G``, ranks per head group; must divide ``P`` and be at most the
            number of heads. None: the largest divisor of ``P`` that is at most the heads and
            at most 8 (a node's GPUs).
        ring: across head groups, ring passes (True), a halo (False), or by the window's
            reach (None), as for ``shard_sequence``.
    """

    head_group_size: int | None = None
    ring: bool | None = None
    name = "shard_hybrid"

    def __post_init__(self) -> None:
        g = self.head_group_size
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            raise StrategyOptionError("head_group_size", f"{g!r} is out of range: expected an integer >= 1 or null")
        if self.ring is not None and not isinstance(self.ring, bool):
            raise StrategyOptionError("ring", f"{self.ring!r} is out of range: expected true, false or null (auto)")

    def group_size(self, num_heads: int, world_size: int) -> int:
        """``G`` for ``num_heads`` heads on ``world_size`` ranks (the option, or the default)."""
        if self.head_group_size is not None:
            return self.head_group_size
        return max(g for g in divisors(world_size) if g <= min(num_heads, DEFAULT_MAX_HEAD_GROUP))

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        g = self.group_size(num_heads, world_size)
        usable = [d for d in divisors(world_size) if d <= num_heads]
        if world_size % g:
            raise ValueError(
                f"head_group_size = {g} does not divide the {world_size} model-parallel ranks; choose one of {usable}"
            )
        if g > num_heads:
            raise ValueError(
                f"head_group_size = {g} gives a head group more ranks than the {num_heads} heads; "
                f"choose one of {usable}"
            )

    def decided(self, num_heads: int, ranks: int) -> ShardHybrid:
        """With its head group size spelled out."""
        return replace(self, head_group_size=self.group_size(num_heads, ranks))

    def degrees(self, num_heads: int, world_size: int) -> ModelDims:
        g = self.group_size(num_heads, world_size)
        return ModelDims(points=world_size // g, heads=g)

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        mesh = ctx.mesh
        assert mesh is not None  # the processor builds or checks it before any layer runs
        g, sizes = mesh.dims.heads, ctx.layout.sizes
        sequence_index, head_index = divmod(ctx.layout.rank, g)
        members = list(sizes[sequence_index * g : (sequence_index + 1) * g])  # my head group's points
        layout = ShardLayout(tuple(super_blocks(sizes, g)), sequence_index)
        heads = shard_sizes(attn.num_heads, g)
        head_group = mesh.axis_group("heads")
        with self.phase("points_to_heads"):
            qkv = attn.qkv_packed(h, first_point=ctx.layout.start)
            qkv = points_to_heads(qkv, members, heads, head_index, head_group, ctx.transport)
        with self.phase("across_head_groups"):
            first_head = sum(heads[:head_index])
            out = self._across_groups(attn, qkv[0], qkv[1], qkv[2], layout, mesh, ctx, first_head)
        with self.phase("heads_to_points"):
            return heads_to_points(out, members, heads, head_index, head_group, ctx.transport)

    def _across_groups(
        self,
        attn: HeadAttention,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layout: ShardLayout,
        mesh: ModelMesh,
        ctx: ShardContext,
        first_head: int,
    ) -> Tensor:
        """Attention of this super-block's queries (my heads, from the layer's ``first_head``)
        over the keys the window reaches in every super-block: ``(batch, my heads, super-block
        points, head_dim)``."""
        ids, window = ctx.key_segment_ids, attn.window_size  # ids: every point's, or None
        if layout.world_size == 1:
            return attn.attend(q, k, v, segment_ids=ids, first_head=first_head)
        sequence_group = mesh.axis_group("points")
        if ShardSequence(ring=self.ring).uses_ring(layout, window):
            if attn.dropout_p > 0 and attn.training:
                raise ValueError(
                    "shard_hybrid: attention dropout (dropout_p > 0) does not run through ring passes; "
                    "set dropout_p=0, or ring=False to gather the halo instead"
                )
            mods = attn.score_mods(first_head, q.shape[1], q.device)
            return ring_attention(q, k, v, window, layout, sequence_group, ctx.transport, ids, mods)
        d = q.shape[-1]
        kv = torch.cat([k, v], dim=-1)  # one halo message for both
        exchange = start_halo_exchange(kv, HaloConfig(width=window, dim=2), layout, sequence_group, ctx.transport)
        left, right = halo_extent(layout, window)
        padded_ids = None if ids is None else ids[:, layout.start - left : layout.stop + right]
        parts = halo_attention(
            attn, q, k, v, exchange, lambda t, _: (t[..., :d], t[..., d:]), layout, padded_ids, first_head
        )
        return torch.cat(parts, dim=2)

    # Its cost: the head all-to-all inside each head group, then the sequence exchange of my
    # heads' k and v across the super-blocks (a halo of 2 c_r values per row, or the ring's
    # blocks of c_r), overlapped with attention.

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        g = self.group_size(work.num_heads, len(sizes))
        sequence_index, head_index = divmod(rank, g)
        members = sizes[sequence_index * g : (sequence_index + 1) * g]
        row, passes = work.attention_row_bytes, work.forward_passes  # q, k, v, outputs: A values a point
        total = head_all_to_all_bytes(members, head_index, work.num_heads, row, passes) if g > 1 else 0
        supers = super_blocks(sizes, g)
        mine = row * shard_sizes(work.num_heads, g)[head_index] // work.num_heads  # my heads' share of a row
        if len(supers) == 1:
            return total
        if uses_ring(supers, work.window_size, self.ring):
            return total + ring_bytes(supers, sequence_index, work.window_size, mine, passes)
        return total + halo_bytes(supers, sequence_index, work.window_size, 2 * mine, passes)

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        g, passes, layers = self.group_size(work.num_heads, work.ranks), work.forward_passes, work.num_layers
        supers = super_blocks(sizes, g)
        within = max(ShardHeads().processor_bytes(work, sizes[:g], r) for r in range(g)) if g > 1 else 0
        return [
            CommPart(within, layers * (2 * passes + 2) * (g - 1), g, overlapped=False),
            CommPart(
                max(sent - within, 0),
                layers * sequence_messages(supers, work.window_size, passes, self.ring),
                work.ranks,
                True,
            ),
        ]

    def work_share(self, work: Workload) -> tuple[float, float]:
        g = self.group_size(work.num_heads, work.ranks)
        return max(shard_sizes(work.points, work.ranks // g)) / work.points, max(
            shard_sizes(work.num_heads, g)
        ) / work.num_heads

    def copies_per_value(self, work: Workload) -> float:
        """Its all-to-all (as ``shard_heads``), and k, v joined, padded and split again."""
        return 16.0 + 8.0

    def kept_values_per_layer(self, work: Workload) -> int:
        """My heads' share of the halo rows' k and v."""
        g = self.group_size(work.num_heads, work.ranks)
        supers, n = super_blocks(work.sizes, g), work.points
        if len(supers) == 1 or uses_ring(supers, work.window_size, self.ring):
            return 0
        return 2 * min(work.window_size or n, n) * 2 * work.attention_channels // g

    @classmethod
    def planner_candidates(cls, num_heads: int, ranks: int) -> list[ShardHybrid]:
        """Every head group size strictly between one rank and all of them."""
        return [cls(head_group_size=g) for g in divisors(ranks) if 1 < g < ranks]
