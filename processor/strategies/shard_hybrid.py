"""``shard_hybrid``: heads within groups of ranks, sequence across them (USP's 2-D design).

The ``P`` model-parallel ranks form ``P / G`` head groups of ``G`` consecutive ranks
(:class:`~processor.distributed.hybrid_groups.HybridGroups`); each head group holds one
contiguous super-block of points. Per layer:

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

from dataclasses import dataclass

import torch
from torch import Tensor

from processor.distributed.halo import HaloConfig, halo_extent, start_halo_exchange
from processor.distributed.hybrid_groups import HybridGroups, divisors, super_blocks
from processor.distributed.ring import ring_attention
from processor.distributed.shards import ShardLayout, shard_sizes
from processor.strategies.base import HeadAttention, PointSharded, ShardContext, StrategyOptionError
from processor.strategies.shard_heads import heads_to_points, points_to_heads
from processor.strategies.shard_sequence import ShardSequence, halo_attention

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

    def build_groups(self, group, num_heads: int) -> HybridGroups:
        """The head and sequence groups for ``group``: every rank of it calls this once, together."""
        return HybridGroups.build(group, self.group_size(num_heads, group.size()))

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        groups = self._groups(attn, ctx)
        g, sizes = groups.head_group_size, ctx.layout.sizes
        sequence_index, head_index = divmod(ctx.layout.rank, g)
        members = list(sizes[sequence_index * g : (sequence_index + 1) * g])  # my head group's points
        layout = ShardLayout(tuple(super_blocks(sizes, g)), sequence_index)
        heads = shard_sizes(attn.num_heads, g)
        qkv = points_to_heads(attn.qkv_packed(h), members, heads, head_index, groups.heads, ctx.transport)
        out = self._across_groups(attn, qkv[0], qkv[1], qkv[2], layout, groups, ctx)
        return heads_to_points(out, members, heads, head_index, groups.heads, ctx.transport)

    def _groups(self, attn: HeadAttention, ctx: ShardContext) -> HybridGroups:
        groups = ctx.hybrid_groups
        g = self.group_size(attn.num_heads, ctx.world_size)
        if groups is None or groups.head_group_size != g:
            raise ValueError(
                f"strategy 'shard_hybrid' (head_group_size = {g}) needs its head and sequence groups: "
                "pass group=model.build_groups(group), built once on every rank, instead of the plain group"
            )
        return groups

    def _across_groups(
        self, attn: HeadAttention, q: Tensor, k: Tensor, v: Tensor, layout: ShardLayout, groups: HybridGroups, ctx
    ) -> Tensor:
        """Attention of this super-block's queries (my heads) over the keys the window reaches
        in every super-block: ``(batch, my heads, super-block points, head_dim)``."""
        ids, window = ctx.key_segment_ids, attn.window_size  # ids: every point's, or None
        if layout.world_size == 1:
            return attn.attend(q, k, v, segment_ids=ids)
        if ShardSequence(ring=self.ring).uses_ring(layout, window):
            if getattr(attn, "dropout_p", 0.0) > 0 and getattr(attn, "training", False):
                raise ValueError(
                    "shard_hybrid: attention dropout (dropout_p > 0) does not run through ring passes; "
                    "set dropout_p=0, or ring=False to gather the halo instead"
                )
            return ring_attention(q, k, v, window, layout, groups.sequence, ctx.transport, ids)
        d = q.shape[-1]
        kv = torch.cat([k, v], dim=-1)  # one halo message for both
        exchange = start_halo_exchange(kv, HaloConfig(width=window, dim=2), layout, groups.sequence, ctx.transport)
        left, right = halo_extent(layout, window)
        padded_ids = None if ids is None else ids[:, layout.start - left : layout.stop + right]
        parts = halo_attention(attn, q, k, v, exchange, lambda t: (t[..., :d], t[..., d:]), layout, padded_ids)
        return torch.cat(parts, dim=2)
