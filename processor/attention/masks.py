"""The sliding-window band as a mask: which keys each query sees, and how far a block reaches.

Segment ids ``(rows, n_k)`` (``rows`` is 1 or the batch) are aligned with the keys: a query at
key position ``p`` has the id of key ``p`` and sees key ``j`` only if their ids are equal.
:func:`segment_band_mask` builds the per-block masks that constraint needs, for a given range
of blocks only; :func:`uniform_windows` finds the blocks that need none.
"""

from __future__ import annotations

import torch
from torch import Tensor


def band_mask(n_q: int, n_k: int, window: int, q_offset: int = 0, device=None) -> Tensor:
    """``(n_q, n_k)`` bool mask, True where ``|q_offset + i - j| <= window``."""
    rows = torch.arange(n_q, device=device)[:, None] + q_offset
    cols = torch.arange(n_k, device=device)[None, :]
    return (rows - cols).abs() <= window


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask as the additive one the fused CPU kernels take: 0 where True, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def reach_blocks(window: int, block: int) -> int:
    """Key blocks of ``block`` rows on each side that a block of queries reaches: ``ceil(W / block)``."""
    return -(-window // block)


def same_ids(ids: Tensor, q_lo: int, blocks: int, block: int, k_lo: int, band: int) -> Tensor:
    """``(rows, blocks, block, band)`` bool from ``ids`` ``(rows, n_k)``: True where query ``r`` of
    block ``i`` (key position ``q_lo + i * block + r``) and key ``k_lo + i * block + c`` have
    equal ids. Every key position must exist."""
    q_ids = ids[:, q_lo : q_lo + blocks * block].unflatten(1, (blocks, block))
    k_ids = ids[:, k_lo : k_lo + (blocks - 1) * block + band].unfold(1, band, block)  # (rows, blocks, band)
    return q_ids[..., :, None] == k_ids[..., None, :]


def segment_band_mask(ids: Tensor, q_lo: int, blocks: int, block: int, k_lo: int, band: int, window: int) -> Tensor:
    """:func:`same_ids` and within ``window``: ``(rows, blocks, block, band)`` bool."""
    in_band = band_mask(block, band, window, q_lo - k_lo, device=ids.device)
    return same_ids(ids, q_lo, blocks, block, k_lo, band) & in_band


def uniform_windows(ids: Tensor, q_lo: int, blocks: int, block: int, window: int) -> Tensor:
    """``(rows, blocks)`` bool: True where the keys within ``window`` of block ``i``'s queries
    (key positions ``q_lo + i * block + [0, block)``) all have one id. O(n_k)."""
    n_k = ids.shape[1]
    changes = torch.zeros(ids.shape, dtype=torch.int32, device=ids.device)
    changes[:, 1:] = ids[:, 1:] != ids[:, :-1]
    before = changes.cumsum(1)  # changes at positions <= c
    first = torch.arange(blocks, device=ids.device) * block + (q_lo - window)
    last = (first + block - 1 + 2 * window).clamp(max=n_k - 1)
    return before[:, first.clamp(min=0)] == before[:, last]
