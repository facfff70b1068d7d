"""``shard_sequence``: keep the local points, borrow a halo of W rows from the neighbours.

Per layer the normed input ``h`` is halo-padded (W rows from each side, gathered across
several ranks if a neighbour's shard is shorter than W), keys and values are projected for
the padded rows and queries for the local rows only, so no attention is computed for halo
rows. Exchanging ``h`` (C per row) rather than k and v (2C per row) halves the bytes sent
at the price of projecting 2W extra rows of k and v.
"""

from __future__ import annotations

from processor.distributed.halo import HaloConfig, halo_extent, halo_pad
from processor.strategies.base import ShardContext


class ShardSequence:
    name = "shard_sequence"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        """Any window works on any number of ranks: wide halos span several ranks."""

    def attend(self, attn, h, ctx: ShardContext):
        if ctx.world_size == 1:
            q, k, v = attn.qkv_heads(h)
            return attn.merge_heads(attn.attend(q, k, v))
        window = attn.window_size
        padded = halo_pad(h, HaloConfig(width=window, dim=1), ctx.layout, ctx.group)
        left, _ = halo_extent(ctx.layout, window)
        q = attn.q_heads(h)
        k, v = attn.kv_heads(padded)
        return attn.merge_heads(attn.attend(q, k, v, q_offset=left))
