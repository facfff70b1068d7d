"""``none``: one rank holds every point."""

from __future__ import annotations

from processor.strategies.base import ShardContext


class SingleRank:
    name = "none"

    def check(self, num_heads: int, window_size: int | None, world_size: int) -> None:
        if world_size != 1:
            raise ValueError(f"strategy 'none' runs on one rank; the group has {world_size}")

    def attend(self, attn, h, ctx: ShardContext):
        q, k, v = attn.qkv_heads(h)
        return attn.merge_heads(attn.attend(q, k, v))
