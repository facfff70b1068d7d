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

Segment ids ``(rows, n_k)`` (``rows``: 1 or the batch), aligned with the keys, restrict each
query to keys of its own id. A block whose queries' windows hold one id only is *clean*: the
shared band mask is exact for it. The others are *mixed*: they get a per-block additive mask
``(count, 1, block, band)`` (broadcast over heads) built from the ids for a few blocks at a
time (at most ``_MIXED_MASK_BYTES`` each) and again in backward, where each shift takes its
``(count, 1, block, block)`` slice. Maximal runs of one kind go through one call each (mixed
runs in pieces). The edge calls' masks include the ids, ``(rows, 1, n_q, n_k)``.

Tensors are point-major in memory (``(batch, points, heads, head_dim)``, presented as
``(batch, heads, points, head_dim)`` views): the layout the fused kernels work in and the
one the output projection reads, so nothing is transposed on the way in or out. Saved for
backward: q, k, v, the output and its log-sum-exp, plus the ``O(N)`` ids and the edge masks
(``O(W^2)`` per ids row); no per-block mask is kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from processor.attention.masks import additive, band_mask, reach_blocks, same_ids, segment_band_mask, uniform_windows

_BACKWARD_PARTS = 4
_MIXED_MASK_BYTES = 8 << 20  # largest per-block id mask built at once
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
    """Queries ``[q_lo, q_hi)`` against keys ``[k_lo, k_hi)`` under an exact mask: ``(n_q, n_k)``,
    or ``(rows, 1, n_q, n_k)`` with segment ids."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    mask: Tensor


@dataclass(frozen=True)
class _Run:
    """Interior blocks ``[first, first + count)``; ``mixed``: they need per-block id masks."""

    first: int
    count: int
    mixed: bool


@dataclass(frozen=True)
class _Plan:
    """Interior queries ``[start, stop)`` in blocks, the edge queries around them; with segment
    ids ``(rows, n_k)``, the runs of clean and mixed blocks of each ids row."""

    start: int
    stop: int
    block: int
    reach: int
    key_lo: int  # key position of query ``start``
    scale: float | None
    band_mask: Tensor
    shift_masks: list[Tensor | None]
    edges: list[_Edge]
    runs: tuple[tuple[_Run, ...], ...]
    ids: Tensor | None = None

    @property
    def blocks(self) -> int:
        return (self.stop - self.start) // self.block

    def members(self, row: int, batch: int) -> range:
        """The batch elements that ids row ``row`` applies to."""
        return range(batch) if len(self.runs) == 1 else range(row, row + 1)

    def pieces(self, row: int, most: int, dtype: torch.dtype) -> Iterator[tuple[int, int, Tensor | None]]:
        """``(first, count, mask)`` over ids row ``row``'s runs, at most ``most`` blocks each;
        ``mask``: ``(count, 1, block, band)`` additive for mixed blocks, None for clean ones."""
        band = (2 * self.reach + 1) * self.block
        per_mask = max(1, _MIXED_MASK_BYTES // (self.block * band * dtype.itemsize))
        for run in self.runs[row]:
            step = min(most, per_mask) if run.mixed else most
            for first in range(run.first, run.first + run.count, step):
                count = min(step, run.first + run.count - first)
                yield first, count, self._mixed_mask(row, first, count) if run.mixed else None

    def _mixed_mask(self, row: int, first: int, count: int) -> Tensor:
        """``(count, 1, block, band)`` additive: the band mask, and -inf between different ids."""
        assert self.ids is not None
        q_lo = self.key_lo + first * self.block
        band = (2 * self.reach + 1) * self.block
        same = same_ids(self.ids[row : row + 1], q_lo, count, self.block, q_lo - self.reach * self.block, band)
        return torch.where(same[0], self.band_mask, float("-inf")).unsqueeze(1)


def _edge(q_lo: int, q_hi: int, q_offset: int, window: int, n_k: int, ids: Tensor | None, like: Tensor) -> _Edge:
    k_lo, k_hi = max(0, q_offset + q_lo - window), min(n_k, q_offset + q_hi + window)
    if ids is None:
        allowed = band_mask(q_hi - q_lo, k_hi - k_lo, window, q_offset + q_lo - k_lo, device=like.device)
    else:
        allowed = segment_band_mask(ids, q_offset + q_lo, 1, q_hi - q_lo, k_lo, k_hi - k_lo, window)
    return _Edge(q_lo, q_hi, k_lo, k_hi, additive(allowed, like.dtype))


def _runs(ids: Tensor | None, key_lo: int, blocks: int, block: int, window: int) -> tuple[tuple[_Run, ...], ...]:
    """Maximal runs of clean / mixed blocks per ids row (one clean run without ids)."""
    if ids is None:
        return ((_Run(0, blocks, False),),)
    per_row = []
    for clean in uniform_windows(ids, key_lo, blocks, block, window).tolist():
        runs: list[_Run] = []
        for i, is_clean in enumerate(clean):
            if runs and runs[-1].mixed != is_clean:
                runs[-1] = _Run(runs[-1].first, runs[-1].count + 1, not is_clean)
            else:
                runs.append(_Run(i, 1, not is_clean))
        per_row.append(tuple(runs))
    return tuple(per_row)


def _interior_forward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, plan: _Plan) -> list[Tensor]:
    """Fills ``out``'s interior rows; the log-sum-exp ``(blocks, heads, block)`` per batch element."""
    batch, blocks, block = q.shape[0], plan.blocks, plan.block
    band = (2 * plan.reach + 1) * block
    lses: list[Tensor | None] = [None] * batch
    for row in range(len(plan.runs)):
        for first, count, mask in plan.pieces(row, blocks, q.dtype):
            q_row, k_row = plan.start + first * block, plan.key_lo + (first - plan.reach) * block
            for b in plan.members(row, batch):
                o, lse = _forward_op(
                    _blocks(q[b], q_row, count, block, block),
                    _blocks(k[b], k_row, count, block, band),
                    _blocks(v[b], k_row, count, block, band),
                    attn_mask=plan.band_mask if mask is None else mask,
                    scale=plan.scale,
                )
                _blocks(out[b], q_row, count, block, block).copy_(o)
                del o
                if count == blocks:
                    lses[b] = lse
                    continue
                stored = lses[b]
                if stored is None:
                    stored = lses[b] = lse.new_empty((blocks, *lse.shape[1:]))
                stored[first : first + count].copy_(lse)
    return [lse for lse in lses if lse is not None]  # every element got all its blocks


def _interior_backward(
    b: int, first: int, count: int, mask: Tensor | None, saved: list[Tensor], grads: list[Tensor], plan: _Plan
) -> None:
    """Adds blocks ``[first, first + count)`` of batch element ``b`` to ``grads`` (dq, dk, dv):
    one fused backward per shift. ``saved``: grad, q, k, v, out, and this element's lse."""
    block = plan.block
    grad, q, k, v, out, lse = saved
    q_row = plan.start + first * block
    lse = lse[first : first + count]

    def rows(x: Tensor, row: int) -> Tensor:
        return _blocks(x[b], row, count, block, block)

    for s, shift_mask in enumerate(plan.shift_masks):
        k_row = plan.key_lo + (first + s - plan.reach) * block
        part = shift_mask if mask is None else mask[..., s * block : (s + 1) * block]
        dq, dk, dv = _backward_op(
            rows(grad, q_row),
            rows(q, q_row),
            rows(k, k_row),
            rows(v, k_row),
            rows(out, q_row),
            lse,
            0.0,
            False,
            attn_mask=part,
            scale=plan.scale,
        )
        rows(grads[0], q_row).add_(dq)
        rows(grads[1], k_row).add_(dk)
        rows(grads[2], k_row).add_(dv)
        del dq, dk, dv  # before the next call allocates its own


class _BandedFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, plan: _Plan):  # type: ignore[override]
        out = point_major(q.new_empty(q.shape))
        lses = _interior_forward(q, k, v, out, plan)
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
        grads = [point_major(torch.zeros_like(t)) for t in (q, k, v)]
        # A quarter of the blocks per call: each call's dq, dk, dv are then a quarter of q's size.
        per_call = -(-plan.blocks // _BACKWARD_PARTS)
        for row in range(len(plan.runs)):
            for first, count, mask in plan.pieces(row, per_call, q.dtype):
                for b in plan.members(row, batch):
                    _interior_backward(b, first, count, mask, [grad, q, k, v, out, lses[b]], grads, plan)
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
            grads[0][:, :, queries].add_(dq)
            grads[1][:, :, keys].add_(dk)
            grads[2][:, :, keys].add_(dv)
        return *grads, None


def interior_blocks(n_q: int, n_k: int, window: int, q_offset: int, block: int) -> tuple[int, int]:
    """Queries ``[start, stop)``: the whole blocks whose keys (``ceil(W / block)`` key blocks on
    each side) all exist; ``start == stop`` when there are none."""
    reach = reach_blocks(window, block) * block
    first = max(0, -(q_offset - reach) + block - 1) // block
    last = max(first, min(n_q // block, (n_k - 2 * reach - block - (q_offset - reach)) // block + 1))
    return first * block, last * block


def banded_flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    block: int,
    scale: float | None = None,
    segment_ids: Tensor | None = None,
) -> Tensor:
    """Query ``i`` attends to keys ``j`` with ``|q_offset + i - j| <= window`` (and, with
    ``segment_ids``, an id equal to its own); CPU, no dropout.

    Args:
        q: ``(batch, heads, n_q, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``, with at least one whole interior block
            (:func:`interior_blocks`).
        segment_ids: ``(1 or batch, n_k)`` integer ids aligned with the keys (query ``i`` has
            the id of key ``q_offset + i``), or None.
    Returns:
        ``(batch, heads, n_q, head_dim)``, point-major in memory.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    start, stop = interior_blocks(n_q, n_k, window, q_offset, block)
    if start == stop:
        raise ValueError(f"banded attention: no whole block of {block} queries has all its keys among {n_k}")
    reach = reach_blocks(window, block)
    full_mask, shift_masks = _additive_masks(block, reach, window, q)
    ids = segment_ids
    edges = [_edge(lo, hi, q_offset, window, n_k, ids, q) for lo, hi in ((0, start), (stop, n_q)) if hi > lo]
    runs = _runs(ids, q_offset + start, (stop - start) // block, block, window)
    plan = _Plan(start, stop, block, reach, q_offset + start, scale, full_mask, shift_masks, edges, runs, ids)
    return _BandedFlash.apply(point_major(q), point_major(k), point_major(v), plan)
