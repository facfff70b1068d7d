"""Sliding-window self-attention in O(N·W) time and memory, forward and backward.

Query ``i`` sits at key position ``q_offset + i`` and attends to keys ``j`` with
``|q_offset + i - j| <= window`` (``window=None``: every key). ``q_offset`` lets a rank
attend from its own rows into a halo-padded key block without computing the halo rows'
queries.

Queries are cut into blocks of ``block_size`` rows; block ``b`` attends to a key band of
``block_size + 2 * ceil(W / block_size) * block_size`` rows under one ``(block, band)`` mask
shared by every block, and all interior blocks go through one fused call on strided views of
the keys, so nothing of size ``N x N`` is ever built. On CPU in full precision that call and
its backward are :mod:`processor.attention.banded`; elsewhere (bf16 on CPU, dropout, a GPU
without FlexAttention) it is one ``scaled_dot_product_attention`` call on the same views. On
CUDA the band runs through flash-attn when installed, else FlexAttention's block-sparse
kernel (:mod:`processor.attention.flex`); :mod:`processor.attention.dispatch` holds the rules. The few queries
at either end, whose band would run off the keys, get one small masked call each. Autograd
saves only q, k, v, the output and its log-sum-exp. Outputs are point-major in memory.

Segment ids (``segment_ids``, ``(batch or 1, n_k)`` integers aligned with the keys) further
restrict each query to keys of its own id. The CPU banded kernel keeps the shared mask for
blocks whose windows hold one id and builds per-block masks for the others, a few at a time
(besides the tensors above it saves only the ``O(N)`` ids and its two small edge masks). The SDPA-on-views path builds a
``(blocks, block, band)`` boolean mask per ids row (``O(N·W)``: SDPA's autograd keeps it, or
the additive float copy SDPA makes of it, for backward; the batch is looped over when the
ids differ per element). When every query's window holds every key (``window=None`` among them),
each id is attended on its own: its queries gathered against its keys, cost
``sum(segment_len^2)``. flash-attn (no ids support) is skipped when ids are given.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from processor.attention.banded import banded_flash_attention, cat_points, interior_blocks
from processor.attention.dispatch import AttentionCall, choose_path
from processor.attention.flash import flash_window_attention
from processor.attention.flex import flex_window_attention
from processor.attention.masks import band_mask, reach_blocks, segment_band_mask
from processor.attention.native import NativeBandAttention
from processor.attention.scored import scored_window_attention
from processor.attention.scores import ScoreMods
from processor.segments import segment_id_rows, segment_ids_problem


def default_block_size(window: int) -> int:
    """Query rows per block: half the window (a band of 2.5 W keys per block of W/2 queries).

    Smaller blocks waste less work on masked-out band corners; below ~64 rows the per-block
    overhead wins (measured on CPU at N = 40320, W = 512).
    """
    return max(64, min(256, window // 2))


def _check(q: Tensor, k: Tensor, v: Tensor, window: int | None, q_offset: int) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, points, head_dim); got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    if window is not None and window < 0:
        raise ValueError(f"window must be >= 0 or None, got {window}")
    if q_offset < 0 or q_offset + q.shape[2] > k.shape[2]:
        raise ValueError(f"queries at key positions [{q_offset}, {q_offset + q.shape[2]}) exceed {k.shape[2]} keys")


def _segment_ids(ids: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """``ids`` as ``(1 or batch, n_k)`` int64, or a one-line ``ValueError`` naming ``segment_ids``."""
    problem = segment_ids_problem(ids, q.shape[0], k.shape[2], q.device, axis="n_k", like="the keys")
    if problem is not None:
        raise ValueError(problem)
    return segment_id_rows(ids)


def _sees_every_key(n_q: int, n_k: int, window: int | None, q_offset: int) -> bool:
    # The last query must reach key 0 and the first query the last key.
    return window is None or (q_offset + n_q - 1 - window <= 0 and q_offset + window >= n_k - 1)


def _per_segment(
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
    """:func:`_per_segment` for one ids row ``(n_k,)``: queries and keys sorted by id (a gather
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


def _band_attention(
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


def _blocked(
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
    :func:`_band_attention`. Point-major output."""
    n_q, n_k = q.shape[2], k.shape[2]
    start, stop = interior_blocks(n_q, n_k, window, q_offset, block)
    if start == stop:
        return _band_attention(q, k, v, window, q_offset, dropout_p, scale, ids)
    if banded:
        return banded_flash_attention(q, k, v, window, q_offset, block, scale, ids)
    # Head-major rows (a copy when q, k, v are views of the packed projection) keep the fused
    # kernel's reads sequential; autograd then saves these instead of the projection output.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    parts = []
    if start > 0:
        parts.append(_band_attention(q[:, :, :start], k, v, window, q_offset, dropout_p, scale, ids))
    parts.append(_blocks_on_views(q[:, :, start:stop], k, v, window, q_offset + start, block, dropout_p, scale, ids))
    if stop < n_q:
        parts.append(_band_attention(q[:, :, stop:], k, v, window, q_offset + stop, dropout_p, scale, ids))
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


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int | None,
    *,
    q_offset: int = 0,
    block_size: int | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    segment_ids: Tensor | None = None,
    path: str = "auto",
    mods: ScoreMods | None = None,
) -> Tensor:
    """Attention of each query over the keys within ``window`` positions of it.

    Args:
        q: ``(batch, heads, n_q, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``, ``n_k >= q_offset + n_q``.
        window: half-width ``W``; query ``i`` sees keys ``j`` with ``|q_offset + i - j| <= W``.
        q_offset: key position of query 0.
        block_size: query rows per block (default :func:`default_block_size`).
        segment_ids: integer ids ``(batch, n_k)``, ``(1, n_k)`` or ``(n_k,)``, aligned with the
            keys: key ``j`` has id ``segment_ids[..., j]`` and query ``i`` that of key
            ``q_offset + i``; a query sees only keys of its own id (it always sees itself).
        path: the kernel (:data:`processor.attention.dispatch.PATHS`); ``auto`` picks by
            :func:`~processor.attention.dispatch.choose_path`, any other is forced (a
            ``ValueError`` when it cannot run these tensors). Global windows always run ``dense``
            (or, with ``mods``, what ``auto`` picks for them).
        mods: a softcap and the ALiBi slopes of ``q``'s heads
            (:class:`~processor.attention.scores.ScoreMods`): run by ``scored`` or ``flex`` only.
    Returns:
        ``(batch, heads, n_q, head_dim)``.
    """
    _check(q, k, v, window, q_offset)
    n_q, n_k = q.shape[2], k.shape[2]
    ids = None if segment_ids is None else _segment_ids(segment_ids, q, k)
    if n_q == 0:  # nothing to attend from: ids change nothing
        ids = None
    if mods is not None and mods.active:
        return _modified(q, k, v, window, q_offset, dropout_p, scale, ids, mods, path)
    if _sees_every_key(n_q, n_k, window, q_offset):
        if ids is not None:
            return _per_segment(q, k, v, ids, q_offset, dropout_p, scale)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    assert window is not None
    chosen = choose_path(AttentionCall.of(q, k, v, window, q_offset, ids is not None, dropout_p), path)
    if chosen == "flash_attn":
        return flash_window_attention(q, k, v, window, q_offset, dropout_p, scale)
    if chosen == "flex":
        return flex_window_attention(q, k, v, window, q_offset, scale, ids)
    if chosen == "scored":
        return scored_window_attention(q, k, v, window, q_offset, scale, ids)
    if chosen == "native":  # every query, edges included, in one call
        native_scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        return NativeBandAttention.apply(q, k, v, window, q_offset, native_scale, ids)
    block = block_size or default_block_size(window)
    if chosen == "dense" or n_q <= 2 * block:  # one masked call: forced, or too short to block
        return _band_attention(q, k, v, window, q_offset, dropout_p, scale, ids)
    return _blocked(q, k, v, window, q_offset, block, dropout_p, scale, ids, banded=chosen == "banded")


def _modified(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int | None,
    q_offset: int,
    dropout_p: float,
    scale: float | None,
    ids: Tensor | None,
    mods: ScoreMods,
    path: str,
) -> Tensor:
    """Softcapped or ALiBi-biased attention: ``flex`` or ``scored``, global windows included."""
    reach = k.shape[2] if window is None else window
    call = AttentionCall.of(q, k, v, reach, q_offset, ids is not None, dropout_p, score_mods=True)
    if choose_path(call, path) == "flex":
        return flex_window_attention(q, k, v, reach, q_offset, scale, ids, mods)
    return scored_window_attention(q, k, v, window, q_offset, scale, ids, mods)
