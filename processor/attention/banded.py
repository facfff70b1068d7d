"""Banded attention on CPU through PyTorch's fused flash kernels, with a backward that folds nothing.

Queries come in blocks of ``block`` rows; block ``i`` sees the keys of key blocks ``i - r ..
i + r`` (``r = ceil(W / block)``), shifted by ``key_lo``. Forward is one fused call on strided
views: every block against its ``(2r + 1) * block`` keys under one ``(block, band)`` mask.
Backward calls the fused backward once per shift ``s`` in ``-r..r``, each time on the
non-overlapping key blocks ``i + s`` with the *whole* band's output and log-sum-exp: the
kernel's softmax gradient needs only those (``P = exp(S - lse)``, ``D = rowsum(dO * O)``), so
each call is the exact share of that shift and its key gradient lands on distinct rows.
Autograd through the overlapping views would instead zero-fill and fold a band-sized
gradient (2.5x the keys at ``block = W / 2``). Backward goes through the blocks in a few
chunks so that each call's gradients stay a fraction of q's size. The queries at either end,
whose band would run off the keys, get one exact masked call each in the same function, so
the output is one buffer, saved once.

Tensors are point-major in memory (``(batch, points, heads, head_dim)``, presented as
``(batch, heads, points, head_dim)`` views): the layout the fused kernels work in and the
one the output projection reads, so nothing is transposed on the way in or out. Saved for
backward: q, k, v, the output and its log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from processor.attention.masks import additive, band_mask, reach_blocks

_BACKWARD_PARTS = 4
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
    allowed = band_mask(block, (2 * reach + 1) * block, window, reach * block, device=like.device)
    mask = additive(allowed, like.dtype)
    per_shift: list[Tensor | None] = []
    for s in range(2 * reach + 1):
        cols = slice(s * block, (s + 1) * block)
        per_shift.append(None if bool(allowed[:, cols].all()) else mask[:, cols].contiguous())
    return mask, per_shift


@dataclass(frozen=True)
class _Edge:
    """Queries ``[q_lo, q_hi)`` against keys ``[k_lo, k_hi)`` under an exact band mask."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    mask: Tensor


@dataclass(frozen=True)
class _Plan:
    """Interior queries ``[start, stop)`` in blocks, the edge queries around them."""

    start: int
    stop: int
    block: int
    reach: int
    key_lo: int  # key position of query ``start``
    scale: float | None
    band_mask: Tensor
    shift_masks: list[Tensor | None]
    edges: list[_Edge]

    @property
    def blocks(self) -> int:
        return (self.stop - self.start) // self.block


def _edge(q_lo: int, q_hi: int, q_offset: int, window: int, n_k: int, like: Tensor) -> _Edge:
    k_lo, k_hi = max(0, q_offset + q_lo - window), min(n_k, q_offset + q_hi + window)
    allowed = band_mask(q_hi - q_lo, k_hi - k_lo, window, q_offset + q_lo - k_lo, device=like.device)
    return _Edge(q_lo, q_hi, k_lo, k_hi, additive(allowed, like.dtype))


class _BandedFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, plan: _Plan):  # type: ignore[override]
        batch = q.shape[0]
        out = point_major(q.new_empty(q.shape))
        blocks, block, band = plan.blocks, plan.block, (2 * plan.reach + 1) * plan.block
        first_key = plan.key_lo - plan.reach * block
        lses = []
        for b in range(batch):
            o, lse = _forward_op(
                _blocks(q[b], plan.start, blocks, block, block),
                _blocks(k[b], first_key, blocks, block, band),
                _blocks(v[b], first_key, blocks, block, band),
                attn_mask=plan.band_mask,
                scale=plan.scale,
            )
            _blocks(out[b], plan.start, blocks, block, block).copy_(o)
            lses.append(lse)
            del o
        for e in plan.edges:
            o, lse = _forward_op(
                q[:, :, e.q_lo : e.q_hi],
                k[:, :, e.k_lo : e.k_hi],
                v[:, :, e.k_lo : e.k_hi],
                attn_mask=e.mask,
                scale=plan.scale,
            )
            out[:, :, e.q_lo : e.q_hi].copy_(o)
            lses.append(lse)
        ctx.save_for_backward(q, k, v, out, *lses)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        plan = ctx.plan
        q, k, v, out, *lses = ctx.saved_tensors
        batch = q.shape[0]
        blocks, block = plan.blocks, plan.block
        grad_q, grad_k, grad_v = (point_major(torch.zeros_like(t)) for t in (q, k, v))

        # A quarter of the blocks per call: each call's dq, dk, dv are then a quarter of q's size.
        per_call = -(-blocks // _BACKWARD_PARTS)
        for b in range(batch):
            for first in range(0, blocks, per_call):
                count = min(per_call, blocks - first)
                q_row = plan.start + first * block

                def rows(x: Tensor, row: int, count: int = count) -> Tensor:
                    return _blocks(x, row, count, block, block)

                lse = lses[b][first : first + count]
                for s, mask in enumerate(plan.shift_masks):
                    k_row = plan.key_lo + (first + s - plan.reach) * block
                    dq, dk, dv = _backward_op(
                        rows(grad[b], q_row),
                        rows(q[b], q_row),
                        rows(k[b], k_row),
                        rows(v[b], k_row),
                        rows(out[b], q_row),
                        lse,
                        0.0,
                        False,
                        attn_mask=mask,
                        scale=plan.scale,
                    )
                    rows(grad_q[b], q_row).add_(dq)
                    rows(grad_k[b], k_row).add_(dk)
                    rows(grad_v[b], k_row).add_(dv)
                    del dq, dk, dv  # before the next call allocates its own
        for e, lse in zip(plan.edges, lses[batch:]):
            queries, keys = slice(e.q_lo, e.q_hi), slice(e.k_lo, e.k_hi)
            dq, dk, dv = _backward_op(
                grad[:, :, queries],
                q[:, :, queries],
                k[:, :, keys],
                v[:, :, keys],
                out[:, :, queries],
                lse,
                0.0,
                False,
                attn_mask=e.mask,
                scale=plan.scale,
            )
            grad_q[:, :, queries].add_(dq)
            grad_k[:, :, keys].add_(dk)
            grad_v[:, :, keys].add_(dv)
        return grad_q, grad_k, grad_v, None


def interior_blocks(n_q: int, n_k: int, window: int, q_offset: int, block: int) -> tuple[int, int]:
    """Queries ``[start, stop)``: the whole blocks whose keys (``ceil(W / block)`` key blocks on
    each side) all exist; ``start == stop`` when there are none."""
    reach = reach_blocks(window, block) * block
    first = max(0, -(q_offset - reach) + block - 1) // block
    last = max(first, min(n_q // block, (n_k - 2 * reach - block - (q_offset - reach)) // block + 1))
    return first * block, last * block


def banded_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, block: int, scale: float | None = None
) -> Tensor:
    """Query ``i`` attends to keys ``j`` with ``|q_offset + i - j| <= window``; CPU, no dropout.

    Args:
        q: ``(batch, heads, n_q, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``, with at least one whole interior block
            (:func:`interior_blocks`).
    Returns:
        ``(batch, heads, n_q, head_dim)``, point-major in memory.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    start, stop = interior_blocks(n_q, n_k, window, q_offset, block)
    if start == stop:
        raise ValueError(f"banded attention: no whole block of {block} queries has all its keys among {n_k}")
    reach = reach_blocks(window, block)
    full_mask, shift_masks = _additive_masks(block, reach, window, q)
    edges = [_edge(lo, hi, q_offset, window, n_k, q) for lo, hi in ((0, start), (stop, n_q)) if hi > lo]
    plan = _Plan(start, stop, block, reach, q_offset + start, scale, full_mask, shift_masks, edges)
    return _BandedFlash.apply(point_major(q), point_major(k), point_major(v), plan)
