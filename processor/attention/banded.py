"""Banded attention on CPU through PyTorch's fused flash kernels, with a backward that folds nothing.

Queries come in blocks of ``block`` rows; block ``i`` sees the keys of key blocks ``i - r ..
i + r`` (``r = ceil(W / block)``), shifted by ``key_lo``. Forward is one fused call on strided
views: every block against its ``(2r + 1) * block`` keys under one ``(block, band)`` mask.
Backward calls the fused backward once per shift ``s`` in ``-r..r``, each time on the
non-overlapping key blocks ``i + s`` with the *whole* band's output and log-sum-exp: the
kernel's softmax gradient needs only those (``P = exp(S - lse)``, ``D = rowsum(dO * O)``), so
each call is the exact share of that shift and its key gradient lands on distinct rows.
Autograd through the overlapping views would instead zero-fill and fold a band-sized
gradient (2.5x the keys at ``block = W / 2``).

Tensors are point-major in memory (``(batch, points, heads, head_dim)``, presented as
``(batch, heads, points, head_dim)`` views): the layout the fused kernels work in and the
one the output projection reads, so nothing is transposed on the way in or out. Saved for
backward: q, k, v, the output and its log-sum-exp.
"""

from __future__ import annotations

import torch
from torch import Tensor

_forward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_backward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def point_major(x: Tensor) -> Tensor:
    """``(batch, heads, points, head_dim)`` with points-then-heads memory (a copy unless it is)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def cat_points(parts: list[Tensor]) -> Tensor:
    """Concatenate ``(batch, heads, points_i, head_dim)`` along points into point-major memory."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p.transpose(1, 2) for p in parts], dim=1).transpose(1, 2)


def _blocks(x: Tensor, first_row: int, blocks: int, block: int, rows: int) -> Tensor:
    """``(heads, points, head_dim)`` -> ``(blocks, heads, rows, head_dim)`` view: block ``i`` holds
    rows ``first_row + i * block + [0, rows)``."""
    heads, _, dim = x.shape
    s_head, s_row, s_dim = x.stride()
    return x.as_strided(
        (blocks, heads, rows, dim), (block * s_row, s_head, s_row, s_dim), x.storage_offset() + first_row * s_row
    )


def _additive_masks(block: int, reach: int, window: int, like: Tensor) -> tuple[Tensor, list[Tensor | None]]:
    """The ``(block, band)`` additive band mask and its ``(block, block)`` slice per shift
    (None where a shift's keys are all in reach)."""
    band = (2 * reach + 1) * block
    offset = (
        torch.arange(band, device=like.device)[None, :]
        - reach * block
        - torch.arange(block, device=like.device)[:, None]
    )
    allowed = offset.abs() <= window
    mask = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device).masked_fill(~allowed, float("-inf"))
    per_shift: list[Tensor | None] = []
    for s in range(2 * reach + 1):
        cols = slice(s * block, (s + 1) * block)
        per_shift.append(None if bool(allowed[:, cols].all()) else mask[:, cols].contiguous())
    return mask, per_shift


class _BandedFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int, block: int, key_lo: int, scale: float | None):  # type: ignore[override]
        batch, heads, n_q, dim = q.shape
        blocks, reach = n_q // block, -(-window // block)
        mask, per_shift = _additive_masks(block, reach, window, q)
        band, first_key = (2 * reach + 1) * block, key_lo - reach * block
        outs, lses = [], []
        for b in range(batch):
            out, lse = _forward_op(
                _blocks(q[b], 0, blocks, block, block),
                _blocks(k[b], first_key, blocks, block, band),
                _blocks(v[b], first_key, blocks, block, band),
                attn_mask=mask,
                scale=scale,
            )
            outs.append(out)
            lses.append(lse)
        ctx.save_for_backward(q, k, v, *outs, *lses)
        ctx.plan = (block, reach, key_lo, scale, per_shift)
        # (blocks, heads, block, dim) views of (blocks, block, heads, dim) memory -> point-major.
        rows = [o.transpose(1, 2).reshape(n_q, heads, dim) for o in outs]
        return (rows[0].unsqueeze(0) if batch == 1 else torch.stack(rows)).transpose(1, 2)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        block, reach, key_lo, scale, per_shift = ctx.plan
        q, k, v, *rest = ctx.saved_tensors
        batch, heads, n_q, dim = q.shape
        outs, lses = rest[:batch], rest[batch:]
        blocks = n_q // block
        grad_q, grad_k, grad_v = (point_major(torch.zeros_like(t)) for t in (q, k, v))
        for b in range(batch):
            q_b, grad_b = _blocks(q[b], 0, blocks, block, block), _blocks(grad[b], 0, blocks, block, block)
            for s, mask in enumerate(per_shift):
                lo = key_lo + (s - reach) * block
                dq, dk, dv = _backward_op(
                    grad_b,
                    q_b,
                    _blocks(k[b], lo, blocks, block, block),
                    _blocks(v[b], lo, blocks, block, block),
                    outs[b],
                    lses[b],
                    0.0,
                    False,
                    attn_mask=mask,
                    scale=scale,
                )
                _blocks(grad_q[b], 0, blocks, block, block).add_(dq)
                _blocks(grad_k[b], lo, blocks, block, block).add_(dk)
                _blocks(grad_v[b], lo, blocks, block, block).add_(dv)
        return grad_q, grad_k, grad_v, None, None, None, None


def banded_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, block: int, key_lo: int, scale: float | None = None
) -> Tensor:
    """Query row ``i`` (block ``i // block``) attends to key rows ``j`` with ``|key_lo + i - j| <= window``.

    Args:
        q: ``(batch, heads, blocks * block, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``; every block's keys must exist:
            ``key_lo >= r * block`` and ``key_lo + (blocks + r) * block <= n_k``, ``r = ceil(window / block)``.
    Returns:
        ``(batch, heads, blocks * block, head_dim)``, point-major in memory.
    """
    reach = -(-window // block)
    if q.shape[2] % block or key_lo < reach * block or key_lo + q.shape[2] + reach * block > k.shape[2]:
        raise ValueError(
            f"banded attention: {q.shape[2]} queries from key {key_lo} in blocks of {block} overrun {k.shape[2]} keys"
        )
    return _BandedFlash.apply(point_major(q), point_major(k), point_major(v), window, block, key_lo, scale)
