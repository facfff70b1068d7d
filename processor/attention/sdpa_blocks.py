"""The ``sdpa_blocks`` and ``dense`` paths of :func:`processor.attention.kernel.sliding_window_attention`
(and the edges of the ``banded`` one): windowed attention through ``scaled_dot_product_attention``.

Queries are cut into blocks of ``block`` rows; block ``b`` attends to a key band of
``block + 2 * ceil(W / block) * block`` rows under one ``(block, band)`` mask shared by every
block, and all interior blocks go through one fused call on strided views of the keys, so
nothing of size ``N x N`` is ever built (on CPU in full precision the ``banded`` kernel,
:mod:`processor.attention.banded`, takes the interior instead). The few queries at either end,
whose band would run off the keys, get one small masked call each. Outputs are point-major in
memory.

Segment ids (``(rows, n_k)`` integers aligned with the keys) further restrict each query to
keys of its own id: the views path builds a ``(blocks, block, band)`` boolean mask per ids row
(``O(N·W)``: SDPA's autograd keeps it, or the additive float copy SDPA makes of it, for
backward; the batch is looped over when the ids differ per element). When every query's window
holds every key, :func:`per_segment` attends each id on its own: its queries gathered against
its keys, cost ``sum(segment_len^2)``, no mask at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from processor.attention.banded import banded_flash_attention, cat_points, interior_blocks
from processor.attention.masks import band_mask, reach_blocks, segment_band_mask


def per_segment(
    q: Tensor, k: Tensor, v: Tensor, ids: Tensor, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    """Every key in reach: each id's queries against that id's keys, ``ids`` ``(1 or batch, n_k)``;
    no mask at all. ``(batch, heads, n_q, head_dim)``."""
    if ids.shape[0] == 1:
        return _segments_of_row(q, k, v, ids[0], q_offset, dropout_p, scale)
    rows = [
        _segments_of_row(q[b : b + 1], k[b : b + 1], v[b : b + 1], ids[b], q_offset, dropout_p, scale)
        for b in range(q.shape[0])
    ]
    return torch.cat(rows)


def _segments_of_row(
    q: Tensor, k: Tensor, v: Tensor, ids: Tensor, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    """:func:`per_segment` for one ids row ``(n_k,)``: queries and keys sorted by id (a gather
    each), one SDPA call per id present among the queries, the output gathered back."""
    q_ids, q_order = torch.sort(ids[q_offset : q_offset + q.shape[2]], stable=True)
    k_ids, k_order = torch.sort(ids, stable=True)
    segments, q_counts = torch.unique_consecutive(q_ids, return_counts=True)
    k_lo, k_hi = torch.searchsorted(k_ids, segments), torch.searchsorted(k_ids, segments, right=True)
    q, k, v = q.index_select(2, q_order), k.index_select(2, k_order), v.index_select(2, k_order)
    parts, row = [], 0
    for count, lo, hi in zip(q_counts.tolist(), k_lo.tolist(), k_hi.tolist()):
        parts.append(
            F.scaled_dot_product_attention(
                q[:, :, row : row + count], k[:, :, lo:hi], v[:, :, lo:hi], dropout_p=dropout_p, scale=scale
            )
        )
        row += count
    back = torch.empty_like(q_order)
    back[q_order] = torch.arange(q_order.numel(), device=q_order.device)
    return torch.cat(parts, dim=2).index_select(2, back)


def band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    dropout_p: float,
    scale: float | None,
    ids: Tensor | None = None,
) -> Tensor:
    """One SDPA call over the keys that ``q``'s rows can reach, under an exact band mask
    (``(n_q, keys)``, or ``(1 or batch, 1, n_q, keys)`` with ``ids``)."""
    n_q, n_k = q.shape[2], k.shape[2]
    lo, hi = max(0, q_offset - window), min(n_k, q_offset + n_q + window)
    if ids is None:
        mask = band_mask(n_q, hi - lo, window, q_offset - lo, device=q.device)
    else:
        mask = segment_band_mask(ids, q_offset, 1, n_q, lo, hi - lo, window)
    return F.scaled_dot_product_attention(
        q, k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=mask, dropout_p=dropout_p, scale=scale
    )


def blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    block: int,
    dropout_p: float,
    scale: float | None,
    ids: Tensor | None,
    banded: bool,
) -> Tensor:
    """Interior blocks (whose whole key band exists) in one fused call on views of q, k, v
    (the CPU ``banded`` kernel, or SDPA on strided views); the few edge queries at each end by
    :func:`band_attention`. Point-major output."""
    n_q, n_k = q.shape[2], k.shape[2]
    start, stop = interior_blocks(n_q, n_k, window, q_offset, block)
    if start == stop:
        return band_attention(q, k, v, window, q_offset, dropout_p, scale, ids)
    if banded:
        return banded_flash_attention(q, k, v, window, q_offset, block, scale, ids)
    # Head-major rows (a copy when q, k, v are views of the packed projection) keep the fused
    # kernel's reads sequential; autograd then saves these instead of the projection output.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    parts = []
    if start > 0:
        parts.append(band_attention(q[:, :, :start], k, v, window, q_offset, dropout_p, scale, ids))
    parts.append(_blocks_on_views(q[:, :, start:stop], k, v, window, q_offset + start, block, dropout_p, scale, ids))
    if stop < n_q:
        parts.append(band_attention(q[:, :, stop:], k, v, window, q_offset + stop, dropout_p, scale, ids))
    return cat_points(parts)


def _blocks_on_views(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    key_lo: int,
    block: int,
    dropout_p: float,
    scale: float | None,
    ids: Tensor | None = None,
) -> Tensor:
    """Every block of ``q`` against its ``block + 2 * reach`` keys from ``key_lo - reach``, in one
    SDPA call on overlapping views of k and v under one ``(block, band)`` mask (autograd folds
    the band gradients back). With ``ids`` ``(rows, n_k)`` the mask is ``(blocks, block, band)``
    booleans per ids row (``O(N·W)``, kept by SDPA's autograd), one call per batch element when
    ``rows > 1`` so that the mask broadcasts over heads."""
    b, h, n_q, d = q.shape
    blocks, reach = n_q // block, reach_blocks(window, block) * block
    band = block + 2 * reach
    lo = key_lo - reach
    if ids is None:
        mask = band_mask(block, band, window, reach, device=q.device)  # the same for every block
    else:
        mask = segment_band_mask(ids, key_lo, blocks, block, lo, band, window)  # (rows, blocks, block, band)
        if ids.shape[0] > 1:
            outs = [
                _views_sdpa(q[i : i + 1], k[i : i + 1], v[i : i + 1], lo, block, band, mask[i], dropout_p, scale)
                for i in range(b)
            ]
            return torch.cat(outs)
        mask = mask[0]
    return _views_sdpa(q, k, v, lo, block, band, mask, dropout_p, scale)


def _views_sdpa(
    q: Tensor, k: Tensor, v: Tensor, lo: int, block: int, band: int, mask: Tensor, dropout_p: float, scale: float | None
) -> Tensor:
    """``q`` ``(b, h, blocks * block, d)`` in blocks against key bands from row ``lo``; ``mask``
    ``(block, band)`` or ``(blocks, block, band)``, broadcast over ``b * h``."""
    b, h, n_q, d = q.shape
    blocks = n_q // block
    # (b * h, blocks, band, d): overlapping windows of the keys, a view when b == 1.
    k_blocks = k[:, :, lo : lo + (blocks - 1) * block + band].unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    v_blocks = v[:, :, lo : lo + (blocks - 1) * block + band].unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    q_blocks = q.unflatten(2, (blocks, block)).flatten(0, 1)
    out = F.scaled_dot_product_attention(q_blocks, k_blocks, v_blocks, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    return out.reshape(b, h, n_q, d)
