"""The ``scored`` attention path: explicit logits, so that anything may change them.

Windowed (or global) attention of ``q`` over ``k, v`` as one :class:`~processor.attention.partial.BlockPair`
of :mod:`processor.attention.partial`'s explicit path: query rows in pieces of at most
``_EXPLICIT_ELEMENTS`` logits against the keys their band reaches, each piece's logits scaled, then
softcapped and ALiBi-biased (:class:`~processor.attention.score_mods.ScoreMods`), masked (band and
segment ids), softmaxed in float32 or better. Backward recomputes each piece's probabilities
from the saved log-sum-exp: saved are q, k, v, the output and its log-sum-exp, no ``N x W``
tensor. Any device and dtype; no attention dropout. It is the path for softcap and ALiBi
where FlexAttention is not available (every CPU run with a gradient), and the plainest
statement of what the other paths compute.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from processor.attention.partial import BlockPair, partial_attention, partial_attention_backward
from processor.attention.score_mods import ScoreMods


class _Scored(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, pair: BlockPair, scale: float, mods: ScoreMods):  # type: ignore[override]
        out, lse = partial_attention(q, k, v, pair, scale, mods)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.pair, ctx.scale, ctx.mods = pair, scale, mods
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = partial_attention_backward(grad.contiguous(), q, k, v, out, lse, ctx.pair, ctx.scale, ctx.mods)
        return dq, dk, dv, None, None, None


def scored_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int | None,
    q_offset: int = 0,
    scale: float | None = None,
    ids: Tensor | None = None,
    mods: ScoreMods | None = None,
) -> Tensor:
    """Query ``i`` (key position ``q_offset + i``) over keys ``j`` with ``|q_offset + i - j| <= window``.

    Args:
        q: ``(batch, heads, n_q, head_dim)``; k, v: ``(batch, heads, n_k, head_dim)``.
        ids: ``(1 or batch, n_k)`` int64 segment ids aligned with the keys, or None.
        mods: softcap and the ALiBi slopes of ``q``'s heads (ALiBi's ``|i - j|`` is a difference
            of positions: a rank's local frame gives the global distance).
    Returns:
        ``(batch, heads, n_q, head_dim)``.
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    q_ids = None if ids is None else ids[:, q_offset : q_offset + q.shape[2]]
    pair = BlockPair(q_offset, 0, window, q_ids, ids)
    return _Scored.apply(q, k, v, pair, scale, mods or ScoreMods())
