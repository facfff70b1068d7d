"""``shard_heads``: trade point shards for head shards, attend over every point, trade back.

Forward, per layer: one all-to-all carries q, k and v (packed) from "my points, all heads"
to "all points, my heads"; a second carries the attention output back. Heads are split
like points (larger shards first), so a head count not divisible by the ranks works.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from processor.distributed.collectives import all_to_all
from processor.distributed.shards import shard_sizes
from processor.strategies.base import HeadAttention, PointSharded, ShardContext, require_a_head_per_rank


class ShardHeads(PointSharded):
    name = "shard_heads"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        require_a_head_per_rank(self.name, num_heads, world_size)

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        rank, points = ctx.layout.rank, list(ctx.layout.sizes)
        heads = shard_sizes(attn.num_heads, ctx.world_size)
        b, n, _ = h.shape
        d, mine = attn.head_dim, heads[rank]

        def exchange(x: Tensor, send: list[int], recv: list[int]) -> Tensor:
            return all_to_all(x, send, recv, ctx.group, ctx.transport)

        qkv = attn.qkv_packed(h)  # (b, n, 3, heads, d)
        send = rearrange(qkv, "b n t h d -> h t b n d").reshape(-1)  # chunk r = heads of rank r
        received = exchange(send, [hr * 3 * b * n * d for hr in heads], [mine * 3 * b * ns * d for ns in points])
        chunks = received.split([mine * 3 * b * ns * d for ns in points])
        qkv_all = torch.cat(
            [rearrange(c, "(h t b n d) -> t b h n d", h=mine, t=3, b=b, d=d) for c in chunks], dim=3
        )  # (3, b, my heads, all points, d)
        out = attn.attend(qkv_all[0], qkv_all[1], qkv_all[2], segment_ids=ctx.key_segment_ids)

        send = rearrange(out, "b h n d -> n b h d").reshape(-1)  # chunk s = points of rank s
        received = exchange(send, [ns * b * mine * d for ns in points], [n * b * hr * d for hr in heads])
        chunks = received.split([n * b * hr * d for hr in heads])
        merged = torch.cat([rearrange(c, "(n b h d) -> b n h d", n=n, b=b, d=d) for c in chunks], dim=2)
        return merged.reshape(b, n, attn.num_heads * d)
