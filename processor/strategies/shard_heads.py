"""``shard_heads``: trade point shards for head shards, attend over every point, trade back.

Forward, per layer: one all-to-all carries q, k and v (packed) from "my points, all heads"
to "all points, my heads"; a second carries the attention output back. Heads are split
like points (larger shards first), so a head count not divisible by the ranks works.
:func:`points_to_heads` and :func:`heads_to_points` are the two trades; ``shard_hybrid``
makes them inside groups of ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from einops import rearrange
from torch import Tensor

from processor.distributed.collectives import all_to_all
from processor.distributed.mesh import ModelDims
from processor.distributed.shards import shard_sizes
from processor.distributed.transport import Transport
from processor.strategies.base import HeadAttention, PointSharded, ShardContext, require_a_head_per_rank
from processor.strategies.cost import CommPart, Workload
from processor.strategies.traffic import head_all_to_all_bytes


class ShardHeads(PointSharded):
    name = "shard_heads"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        require_a_head_per_rank(self.name, num_heads, world_size)

    def degrees(self, num_heads: int, world_size: int) -> ModelDims:
        return ModelDims(heads=world_size)

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        points, rank = list(ctx.layout.sizes), ctx.layout.rank
        heads = shard_sizes(attn.num_heads, ctx.world_size)
        with self.phase("points_to_heads"):
            qkv = attn.qkv_packed(h, first_point=ctx.layout.start)
            qkv = points_to_heads(qkv, points, heads, rank, ctx.group, ctx.transport)
        with self.phase("attend_my_heads"):
            out = attn.attend(qkv[0], qkv[1], qkv[2], segment_ids=ctx.key_segment_ids, first_head=sum(heads[:rank]))
        with self.phase("heads_to_points"):
            return heads_to_points(out, points, heads, rank, ctx.group, ctx.transport)

    # Its cost: two all-to-alls per layer on the critical path, every point's attention for my heads.

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        row = work.attention_row_bytes  # q, k, v and the output: A values a point
        return head_all_to_all_bytes(sizes, rank, work.num_heads, row, work.forward_passes)

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        messages = work.num_layers * (2 * work.forward_passes + 2) * (work.ranks - 1)
        return [CommPart(sent, messages, work.ranks, overlapped=False)]

    def work_share(self, work: Workload) -> tuple[float, float]:
        return 1.0, max(shard_sizes(work.num_heads, work.ranks)) / work.num_heads

    def copies_per_value(self, work: Workload) -> float:
        """The all-to-alls rearrange q, k, v (3 C) and the output (C) on both sides, both ways."""
        return 16.0


def points_to_heads(
    qkv: Tensor, points: list[int], heads: list[int], rank: int, group: dist.ProcessGroup | None, transport: Transport
) -> Tensor:
    """``(batch, my points, 3, all heads, head_dim)`` -> ``(3, batch, my heads, all points,
    head_dim)``: rank ``r`` of ``group`` holds ``points[r]`` points before and ``heads[r]``
    heads after; the points come in rank order. A group of one rank (None) trades nothing."""
    if len(points) == 1:
        return rearrange(qkv, "b n t h d -> t b h n d")
    b, n, _, _, d = qkv.shape
    mine = heads[rank]
    send = rearrange(qkv, "b n t h d -> h t b n d").reshape(-1)  # chunk r = heads of rank r
    received = all_to_all(
        send, [hr * 3 * b * n * d for hr in heads], [mine * 3 * b * ns * d for ns in points], group, transport
    )
    chunks = received.split([mine * 3 * b * ns * d for ns in points])
    return torch.cat([rearrange(c, "(h t b n d) -> t b h n d", h=mine, t=3, b=b, d=d) for c in chunks], dim=3)


def heads_to_points(
    out: Tensor, points: list[int], heads: list[int], rank: int, group: dist.ProcessGroup | None, transport: Transport
) -> Tensor:
    """The way back: ``(batch, my heads, all points, head_dim)`` -> ``(batch, my points, all
    heads * head_dim)``, heads in rank order."""
    if len(points) == 1:
        return rearrange(out, "b h n d -> b n (h d)")
    b, _, _, d = out.shape
    mine, n = heads[rank], points[rank]
    send = rearrange(out, "b h n d -> n b h d").reshape(-1)  # chunk s = points of rank s
    received = all_to_all(
        send, [ns * b * mine * d for ns in points], [n * b * hr * d for hr in heads], group, transport
    )
    chunks = received.split([n * b * hr * d for hr in heads])
    merged = torch.cat([rearrange(c, "(n b h d) -> b n h d", n=n, b=b, d=d) for c in chunks], dim=2)
    return merged.reshape(b, n, sum(heads) * d)
