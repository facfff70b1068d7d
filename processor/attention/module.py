"""Multi-head sliding-window self-attention: the projections, the kernel and the head merge.

The layer knows nothing of ranks: a strategy (:mod:`processor.strategies`) calls these
methods, as its :class:`~processor.strategies.HeadAttention`, on the points and heads it holds.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from processor.attention.banded import cat_points
from processor.attention.kernel import sliding_window_attention
from processor.attention.qk_heads import fused_qk_heads, fused_qk_heads_serve
from processor.attention.score_mods import ScoreMods, alibi_slopes, rotate
from processor.matmul.backends import Linear, linear
from processor.precision import in_compute_dtype


class SelfAttention(nn.Module):
    """Sliding-window multi-head self-attention on ``(batch, points, channels)``.

    Parameters: ``qkv`` ``(3 * heads * head_dim, C)`` as ``[q; k; v]``, heads contiguous within
    each, no bias; ``proj`` ``(C, heads * head_dim)`` with bias; optional q/k LayerNorms over
    ``head_dim`` (with or without a bias). ``heads * head_dim`` is ``attn_channels`` (default
    ``C``). ``num_heads`` is the heads this module holds: all of them, or this rank's share
    (from head ``first_head`` of ``total_heads``) after ``shard_channels`` split the parameters.
    ``path`` picks the windowed kernel (:mod:`processor.attention.dispatch`; ``auto``: by
    device, dtype and whether a gradient is needed). ``softcap``, ``alibi`` and ``rotary`` are
    anemoi's (:mod:`processor.attention.score_mods`); their positions are global point indices,
    which the caller gives as ``first_point`` (of ``h``'s rows) and ``q_offset``.
    """

    def __init__(
        self,
        num_channels: int,
        num_heads: int,
        window_size: int | None,
        qk_norm: bool = False,
        dropout_p: float = 0.0,
        block_size: int | None = None,
        qk_norm_bias: bool = True,
        path: str = "auto",
        attn_channels: int | None = None,
        softcap: float | None = None,
        alibi: bool = False,
        rotary: bool = False,
    ) -> None:
        super().__init__()
        inner = attn_channels or num_channels
        self.num_heads, self.total_heads, self.first_head = num_heads, num_heads, 0
        self.path = path
        self.head_dim = inner // num_heads
        self.window_size, self.dropout_p, self.block_size = window_size, dropout_p, block_size
        self.softcap, self.alibi, self.rotary = softcap, alibi, rotary
        self.qkv = Linear(num_channels, 3 * inner, bias=False)
        self.proj = Linear(inner, num_channels)
        self.q_norm = nn.LayerNorm(self.head_dim, bias=qk_norm_bias) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim, bias=qk_norm_bias) if qk_norm else nn.Identity()

    @property
    def inner_channels(self) -> int:
        """``heads * head_dim`` of the heads this module holds."""
        return self.num_heads * self.head_dim

    def forward(self, h: Tensor, segment_ids: Tensor | None = None) -> Tensor:
        """Every point on this rank: ``(batch, points, channels)`` -> same shape; ``segment_ids``
        ``(batch or 1, points)`` restrict attention to equal ids."""
        q, k, v = self.qkv_heads(h)
        return self.proj(self.merge_heads([self.attend(q, k, v, segment_ids=segment_ids)]))

    # q, k and v come out in the compute dtype (processor.precision): under autocast the q/k
    # norms return fp32, and attention, single-rank or sharded, then gets bf16 either way.
    # ``first_point``: the global index of h's first row (rotary embeddings need it).

    def qkv_packed(self, h: Tensor, first_point: int = 0) -> Tensor:
        """``(b, n, C)`` -> ``(b, n, 3, heads, head_dim)``, q and k normed (and rotated)."""
        q, k, v = self.qkv_heads(h, first_point)
        return rearrange([q, k, v], "t b h n d -> b n t h d")

    def qkv_heads(self, h: Tensor, first_point: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """``(b, n, C)`` -> q, k, v, each ``(b, heads, n, head_dim)``."""
        qkv = self.qkv(h)
        if not self.rotary and fused_qk_heads_serve(qkv, self.num_heads, self.q_norm, self.k_norm):
            return fused_qk_heads(qkv, self.num_heads, self.q_norm, self.k_norm)
        q, k, v = rearrange(qkv, "b n (t h d) -> t b h n d", t=3, h=self.num_heads)
        return self._position(self.q_norm(q), first_point), self._position(self.k_norm(k), first_point), v

    def queries(self, h: Tensor, first_point: int = 0) -> Tensor:
        """Queries only: ``(b, n, C)`` -> ``(b, heads, n, head_dim)``."""
        q = linear(h, self.qkv.weight[: self.inner_channels])
        return self._position(self.q_norm(rearrange(q, "b n (h d) -> b h n d", h=self.num_heads)), first_point)

    def keys_values(self, h: Tensor, first_point: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values only: ``(b, m, C)`` -> k, v, each ``(b, heads, m, head_dim)``."""
        kv = linear(h, self.qkv.weight[self.inner_channels :])
        k, v = rearrange(kv, "b m (t h d) -> t b h m d", t=2, h=self.num_heads)
        return self._position(self.k_norm(k), first_point), v

    def _position(self, x: Tensor, first_point: int) -> Tensor:
        """A normed q or k in the compute dtype, rotated when ``rotary``."""
        x = in_compute_dtype(x)
        return rotate(x, first_point) if self.rotary else x

    def score_mods(
        self, first_head: int | None = None, heads: int | None = None, device: torch.device | None = None
    ) -> ScoreMods | None:
        """The softcap and the ALiBi slopes of heads ``[first_head, first_head + heads)`` of the
        layer's ``total_heads`` (default: the heads this module holds), the slopes on ``device``
        (where the attention runs: moved once per call, not per piece of it); None without either."""
        if self.softcap is None and not self.alibi:
            return None
        first = self.first_head if first_head is None else first_head
        count = self.num_heads if heads is None else heads
        slopes = alibi_slopes(self.total_heads, device)[first : first + count] if self.alibi else None
        return ScoreMods(self.softcap, slopes)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        q_offset: int = 0,
        segment_ids: Tensor | None = None,
        first_head: int | None = None,
    ) -> Tensor:
        """Windowed attention of ``q`` ``(b, h, n_q, d)`` over ``k, v`` ``(b, h, n_k, d)``;
        ``segment_ids`` ``(b or 1, n_k)`` aligned with the keys; ``first_head``: the layer's
        index of ``q``'s first head (ALiBi needs it; default: this module's)."""
        return sliding_window_attention(
            q,
            k,
            v,
            self.window_size,
            q_offset=q_offset,
            block_size=self.block_size,
            dropout_p=self.dropout_p if self.training else 0.0,
            segment_ids=segment_ids,
            path=self.path,
            mods=self.score_mods(first_head, q.shape[1], q.device),
        )

    def merge_heads(self, parts: list[Tensor]) -> Tensor:
        """Consecutive ``(b, heads, n_i, head_dim)`` parts -> ``(b, sum n_i, heads * head_dim)``."""
        return rearrange(cat_points(parts), "b h n d -> b n (h d)")
