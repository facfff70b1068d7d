"""Sliding-window self-attention in O(N·W) time and memory, forward and backward.

Query ``i`` sits at key position ``q_offset + i`` and attends to keys ``j`` with
``|q_offset + i - j| <= window`` (``window=None``: every key). ``q_offset`` lets a rank
attend from its own rows into a halo-padded key block without computing the halo rows'
queries.

Queries are cut into blocks of ``block_size`` rows; block ``b`` attends to a key band of
``block_size + 2 * window`` rows, an overlapping strided *view* of the keys (no copy), under
one exact band mask shared by every block. All blocks go through one 4-D
``scaled_dot_product_attention`` call, so the fused CPU/GPU kernels do the work and nothing
of size ``N x N`` is ever built.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

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


def band_mask(n_q: int, n_k: int, window: int, q_offset: int = 0, device=None) -> Tensor:
    """``(n_q, n_k)`` bool mask, True where ``|q_offset + i - j| <= window``."""
    rows = torch.arange(n_q, device=device)[:, None] + q_offset
    cols = torch.arange(n_k, device=device)[None, :]
    return (rows - cols).abs() <= window


def _key_span(x: Tensor, lo: int, hi: int) -> Tensor:
    """Rows ``[lo, hi)`` of ``x`` along dim 2, zero-filled where they fall outside ``x``."""
    n = x.shape[2]
    inner = x[:, :, max(lo, 0) : min(hi, n)]
    if lo >= 0 and hi <= n:
        return inner
    return F.pad(inner, (0, 0, max(0, -lo), max(0, hi - n)))


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, block: int, dropout_p: float, scale: float | None
) -> Tensor:
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    n_blocks = math.ceil(n_q / block)
    band = block + 2 * window
    lo = q_offset - window  # key position of band row 0 in block 0
    hi = lo + (n_blocks - 1) * block + band
    k_span, v_span = _key_span(k, lo, hi), _key_span(v, lo, hi)
    # (b, h, n_blocks, band, d): overlapping windows of the keys, a view.
    k_blocks = k_span.unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    v_blocks = v_span.unfold(2, band, block).transpose(-1, -2).flatten(0, 1)
    q_blocks = F.pad(q, (0, 0, 0, n_blocks * block - n_q)).reshape(b * h, n_blocks, block, d)

    device = q.device
    r = torch.arange(block, device=device)
    c = torch.arange(band, device=device)
    offset = c[None, :] - r[:, None]
    in_band = (offset >= 0) & (offset <= 2 * window)  # (block, band), same for every block
    block_start = torch.arange(n_blocks, device=device)[:, None] * block
    key_pos = lo + block_start + c[None, :]  # (n_blocks, band)
    key_exists = (key_pos >= 0) & (key_pos < n_k)
    query_is_pad = (block_start + r[None, :]) >= n_q  # (n_blocks, block)
    # Padding queries see every band row so their (discarded) softmax has no empty rows.
    mask = (in_band[None] & key_exists[:, None, :]) | query_is_pad[:, :, None]

    out = F.scaled_dot_product_attention(
        q_blocks, k_blocks, v_blocks, attn_mask=mask[None], dropout_p=dropout_p, scale=scale
    )
    return out.reshape(b, h, n_blocks * block, d)[:, :, :n_q]


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
) -> Tensor:
    """Attention of each query over the keys within ``window`` positions of it.

    Args:
        q: ``(batch, heads, n_q, head_dim)``.
        k, v: ``(batch, heads, n_k, head_dim)``, ``n_k >= q_offset + n_q``.
        window: half-width ``W``; query ``i`` sees keys ``j`` with ``|q_offset + i - j| <= W``.
        q_offset: key position of query 0.
        block_size: query rows per block (default :func:`default_block_size`).
    Returns:
        ``(batch, heads, n_q, head_dim)``.
    """
    _check(q, k, v, window, q_offset)
    n_q, n_k = q.shape[2], k.shape[2]
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
    if n_q <= 2 * block:
        # Too short to block: one band mask over the keys this query range can reach.
        lo, hi = max(0, q_offset - window), min(n_k, q_offset + n_q + window)
        mask = band_mask(n_q, hi - lo, window, q_offset - lo, device=q.device)
        return F.scaled_dot_product_attention(
            q, k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
    return _blocked(q, k, v, window, q_offset, block, dropout_p, scale)
