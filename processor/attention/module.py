"""Multi-head self-attention whose point mixing is delegated to the context's strategy."""

from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from processor.attention.banded import cat_points
from processor.attention.kernel import sliding_window_attention
from processor.strategies.base import ShardContext


class SelfAttention(nn.Module):
    """Sliding-window multi-head self-attention on ``(batch, points, channels)``.

    Parameters are the same on every rank (``qkv``: ``(3C, C)`` as ``[q; k; v]``, heads
    contiguous within each); the strategy in the :class:`ShardContext` only decides where each
    head meets each key. The methods besides ``forward`` are the
    :class:`~processor.strategies.HeadAttention` a strategy works with.
    """

    def __init__(
        self,
        num_channels: int,
        num_heads: int,
        window_size: int | None,
        qk_norm: bool = False,
        dropout_p: float = 0.0,
        block_size: int | None = None,
    ) -> None:
        super().__init__()
        self.num_channels, self.num_heads = num_channels, num_heads
        self.head_dim = num_channels // num_heads
        self.window_size, self.dropout_p, self.block_size = window_size, dropout_p, block_size
        self.qkv = nn.Linear(num_channels, 3 * num_channels, bias=False)
        self.proj = nn.Linear(num_channels, num_channels)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()

    def forward(self, h: Tensor, ctx: ShardContext) -> Tensor:
        """``(batch, local_points, channels)`` -> same shape, for this rank's points."""
        return self.proj(ctx.strategy.attend(self, h, ctx))

    def qkv_packed(self, h: Tensor) -> Tensor:
        """``(b, n, C)`` -> ``(b, n, 3, heads, head_dim)``, q and k normed."""
        qkv = rearrange(self.qkv(h), "b n (t h d) -> b n t h d", t=3, h=self.num_heads)
        q, k, v = qkv.unbind(2)
        return rearrange([self.q_norm(q), self.k_norm(k), v], "t b n h d -> b n t h d")

    def qkv_heads(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(b, n, C)`` -> q, k, v, each ``(b, heads, n, head_dim)``."""
        q, k, v = rearrange(self.qkv(h), "b n (t h d) -> t b h n d", t=3, h=self.num_heads)
        return self.q_norm(q), self.k_norm(k), v

    def queries(self, h: Tensor) -> Tensor:
        """Queries only: ``(b, n, C)`` -> ``(b, heads, n, head_dim)``."""
        q = F.linear(h, self.qkv.weight[: self.num_channels])
        return self.q_norm(rearrange(q, "b n (h d) -> b h n d", h=self.num_heads))

    def keys_values(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values only: ``(b, m, C)`` -> k, v, each ``(b, heads, m, head_dim)``."""
        kv = F.linear(h, self.qkv.weight[self.num_channels :])
        k, v = rearrange(kv, "b m (t h d) -> t b h m d", t=2, h=self.num_heads)
        return self.k_norm(k), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, q_offset: int = 0) -> Tensor:
        """Windowed attention of ``q`` ``(b, h, n_q, d)`` over ``k, v`` ``(b, h, n_k, d)``."""
        return sliding_window_attention(
            q,
            k,
            v,
            self.window_size,
            q_offset=q_offset,
            block_size=self.block_size,
            dropout_p=self.dropout_p if self.training else 0.0,
        )

    def merge_heads(self, parts: list[Tensor]) -> Tensor:
        """Consecutive ``(b, heads, n_i, head_dim)`` parts -> ``(b, sum n_i, C)``."""
        return rearrange(cat_points(parts), "b h n d -> b n (h d)")
