"""Sliding-window self-attention in O(N·W) time and memory, forward and backward.

Query ``i`` sits at key position ``q_offset + i`` and attends to keys ``j`` with
``|q_offset + i - j| <= window`` (``window=None``: every key). ``q_offset`` lets a rank
attend from its own rows into a halo-padded key block without computing the halo rows'
queries.

Queries are cut into blocks of ``block_size`` rows; block ``b`` attends to a key band of
``block_size + 2 * ceil(W / block_size) * block_size`` rows under one ``(block, band)`` mask
shared by every block, and all interior blocks go through one fused call on strided views of
the keys, so nothing of size ``N x N`` is ever built. On CPU in full precision that call and
its backward are :mod:`processor.attention.banded`; elsewhere (GPU without flash-attn, bf16,
dropout) it is one ``scaled_dot_product_attention`` call on the same views. The few queries
at either end, whose band would run off the keys, get one small masked call each. Autograd
saves only q, k, v, the output and its log-sum-exp. Outputs are point-major in memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from processor.attention.banded import banded_flash_attention, cat_points, interior_blocks
from processor.attention.masks import band_mask, reach_blocks
from processor.attention.segmented import check_segment_ids, segmented_attention

try:  # the flash-attn package has a native sliding window on CUDA (fp16/bf16)
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - CPU machines
    flash_attn_func = None


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


def _sees_every_key(n_q: int, n_k: int, window: int | None, q_offset: int) -> bool:
    # The last query must reach key 0 and the first query the last key.
    return window is None or (q_offset + n_q - 1 - window <= 0 and q_offset + window >= n_k - 1)


def _band_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    """One SDPA call over the keys that ``q``'s rows can reach, under an exact band mask."""
    n_q, n_k = q.shape[2], k.shape[2]
    lo, hi = max(0, q_offset - window), min(n_k, q_offset + n_q + window)
    mask = band_mask(n_q, hi - lo, window, q_offset - lo, device=q.device)
    return F.scaled_dot_product_attention(
        q, k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=mask, dropout_p=dropout_p, scale=scale
    )


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, block: int, dropout_p: float, scale: float | None
) -> Tensor:
    """Interior blocks (whose whole key band exists) in one fused call on views of q, k, v;
    the few edge queries at each end by :func:`_band_attention`. Point-major output."""
    n_q, n_k = q.shape[2], k.shape[2]
    start, stop = interior_blocks(n_q, n_k, window, q_offset, block)
    if start == stop:
        return _band_attention(q, k, v, window, q_offset, dropout_p, scale)
    if _fused_band_backward(q, dropout_p):
        return banded_flash_attention(q, k, v, window, q_offset, block, scale)
    # Head-major rows (a copy when q, k, v are views of the packed projection) keep the fused
    # kernel's reads sequential; autograd then saves these instead of the projection output.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    parts = []
    if start > 0:
        parts.append(_band_attention(q[:, :, :start], k, v, window, q_offset, dropout_p, scale))
    parts.append(_blocks_on_views(q[:, :, start:stop], k, v, window, q_offset + start, block, dropout_p, scale))
    if stop < n_q:
        parts.append(_band_attention(q[:, :, stop:], k, v, window, q_offset + stop, dropout_p, scale))
    return cat_points(parts)


def _fused_band_backward(q: Tensor, dropout_p: float) -> bool:
    """CPU, full precision, no dropout: :mod:`processor.attention.banded` (its backward adds
    per-shift gradients, which bf16 would round, and cannot replay dropout)."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and dropout_p == 0.0


def _blocks_on_views(
    q: Tensor, k: Tensor, v: Tensor, window: int, key_lo: int, block: int, dropout_p: float, scale: float | None
) -> Tensor:
    """Every block of ``q`` against its ``block + 2 * reach`` keys from ``key_lo - reach``, in one
    SDPA call on overlapping views of k and v under one ``(block, band)`` mask (autograd folds
    the band gradients back)."""
    b, h, n_q, d = q.shape
    blocks, reach = n_q // block, reach_blocks(window, block) * block
    band = block + 2 * reach
    lo = key_lo - reach
    # (b * h, blocks, band, d): overlapping windows of the keys, a view when b == 1.
    k_blocks = k[:, :, lo : lo + (blocks - 1) * block + band].unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    v_blocks = v[:, :, lo : lo + (blocks - 1) * block + band].unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    q_blocks = q.unflatten(2, (blocks, block)).flatten(0, 1)
    in_band = band_mask(block, band, window, reach, device=q.device)  # the same for every block
    out = F.scaled_dot_product_attention(
        q_blocks, k_blocks, v_blocks, attn_mask=in_band, dropout_p=dropout_p, scale=scale
    )
    return out.reshape(b, h, n_q, d)


def _flash_window(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    # flash-attn aligns query i with key i + n_k - n_q and allows keys in [-left, +right] of it.
    shift = q_offset - (k.shape[2] - q.shape[2])
    left, right = window + shift, window - shift
    out = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=dropout_p,
        softmax_scale=scale,
        window_size=(left, right),
    )
    return out.transpose(1, 2)


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
) -> Tensor:
    """Attention of each query over the keys within ``window`` positions of it.

    Args:
        q: ``(batch, heads, n_q, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``, ``n_k >= q_offset + n_q``.
        window: half-width ``W``; query ``i`` sees keys ``j`` with ``|q_offset + i - j| <= W``.
        q_offset: key position of query 0.
        block_size: query rows per block (default :func:`default_block_size`).
        segment_ids: integer ids ``(batch or 1, n_k)`` or ``(n_k,)`` aligned with the keys
            (query ``i`` has the id of key ``q_offset + i``): attend only to equal ids, through
            :mod:`processor.attention.segmented`.
    Returns:
        ``(batch, heads, n_q, head_dim)``.
    """
    _check(q, k, v, window, q_offset)
    n_q, n_k = q.shape[2], k.shape[2]
    if segment_ids is not None:
        ids = check_segment_ids(segment_ids, q, k)
        block = block_size or default_block_size(window or 0)
        every = _sees_every_key(n_q, n_k, window, q_offset)
        return segmented_attention(
            q, k, v, window, ids, q_offset=q_offset, block=block, dropout_p=dropout_p, scale=scale, every_key=every
        )
    if _sees_every_key(n_q, n_k, window, q_offset):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    assert window is not None
    if (
        flash_attn_func is not None
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
        and 0 <= q_offset - (n_k - n_q) + window
        and 0 <= window - q_offset + (n_k - n_q)
    ):
        return _flash_window(q, k, v, window, q_offset, dropout_p, scale)
    block = block_size or default_block_size(window)
    if n_q <= 2 * block:  # too short to block
        return _band_attention(q, k, v, window, q_offset, dropout_p, scale)
    return _blocked(q, k, v, window, q_offset, block, dropout_p, scale)
