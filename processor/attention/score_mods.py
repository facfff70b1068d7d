"""Position-aware attention settings, as anemoi-models defines them: softcap, ALiBi, rotary.

- **softcap** ``c``: each scaled logit ``s = q.k / sqrt(d)`` becomes ``c * tanh(s / c)``.
- **ALiBi**: then ``-slope_h * |i - j|`` is added, ``i`` and ``j`` the *global* point indices
  of the query and the key, ``slope_h`` anemoi's slopes (:func:`alibi_slopes`).
- **rotary**: q and k (after their norms) are rotated by angles ``position * inv_freq``, the
  position the global point index, GPT-NeoX (non-interleaved) halves, base 10000: flash-attn's
  ``RotaryEmbedding``, which anemoi's flash-attention path uses. Its angles are float32 as
  there (``t`` and ``inv_freq`` in float32), whatever the tensors' dtype.

anemoi runs the three only through flash-attention on a GPU; here softcap and ALiBi are a
:class:`ScoreMods` that the ``scored`` path (any device, explicit logits,
:mod:`processor.attention.scored`) and FlexAttention apply, and rotary is applied to q and k by
the layer (:meth:`processor.attention.SelfAttention.qkv_heads`) where their global positions
are known, before any rank sends them anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

ROTARY_BASE = 10000.0


@dataclass(frozen=True)
class ScoreMods:
    """What changes the logits of one attention call beyond ``q.k * scale``.

    ``softcap``: ``c`` or None; ``slopes``: ALiBi's ``(heads,)`` for the heads of this call
    (already picked out of the layer's, when a rank holds a share of them), or None."""

    softcap: float | None = None
    slopes: Tensor | None = None

    @property
    def active(self) -> bool:
        return self.softcap is not None or self.slopes is not None


def modify_scores(
    scores: Tensor, mods: ScoreMods, q_pos: Tensor, k_pos: Tensor, keep_tanh: bool = False
) -> tuple[Tensor, Tensor | None]:
    """``scores`` ``(..., heads, n_q, n_k)`` (scaled logits, a tensor of the caller's own: it is
    modified in place) with ``mods`` applied, and, when ``keep_tanh``, the softcap's ``tanh``
    (for :func:`softcap_backward`; None without softcap). ``q_pos`` ``(n_q,)`` and ``k_pos``
    ``(n_k,)`` are global point indices."""
    t = None
    if mods.softcap is not None:
        scores.div_(mods.softcap).tanh_()
        t = scores.clone() if keep_tanh else None
        scores.mul_(mods.softcap)
    if mods.slopes is not None:
        distance = (q_pos[:, None] - k_pos[None, :]).abs_().to(scores.dtype)
        scores.addcmul_(mods.slopes.to(scores).view(-1, 1, 1), distance, value=-1)
    return scores, t


def softcap_backward(grad_scores: Tensor, t: Tensor | None) -> Tensor:
    """The gradient through ``c * tanh(s / c)``, in place: ``grad * (1 - tanh^2)`` (identity
    without softcap)."""
    return grad_scores if t is None else grad_scores.mul_(t.mul_(t).neg_().add_(1))


def alibi_slopes(num_heads: int, device: torch.device | str | None = None) -> Tensor:
    """anemoi-models' ALiBi slopes for ``num_heads`` heads, ``(num_heads,)`` float32, computed as
    anemoi computes them: ``2^(-8/n)`` to the powers ``1..n`` for ``n`` the largest power of two
    <= ``num_heads``, then ``2^(-4/n)`` to the odd powers for the remaining heads."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = torch.pow(2 ** (-8 / n), torch.arange(1, 1 + n))
    if n < num_heads:
        slopes = torch.cat([slopes, torch.pow(2 ** (-4 / n), torch.arange(1, 1 + 2 * (num_heads - n), 2))])
    return slopes.to(device=device, dtype=torch.float32)


def rotate(x: Tensor, first_point: int, base: float = ROTARY_BASE) -> Tensor:
    """Rotary embedding of ``x`` ``(batch, heads, points, head_dim)`` (even ``head_dim``) whose
    point ``p`` is the global point ``first_point + p``. Same shape and dtype."""
    d = x.shape[-1]
    cos, sin = _angles(first_point, x.shape[2], d, base, x.device)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _angles(first_point: int, points: int, dim: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin ``(points, dim / 2)`` in float32, as flash-attn's ``RotaryEmbedding`` makes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    t = torch.arange(first_point, first_point + points, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    return torch.cos(freqs), torch.sin(freqs)
