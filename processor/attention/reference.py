"""Dense sliding-window attention: the O(N^2) definition the fast kernel is tested against."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from processor.attention.masks import band_mask


def dense_window_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int | None, q_offset: int = 0, segment_ids: Tensor | None = None
) -> Tensor:
    """Softmax attention under an explicit ``(n_q, n_k)`` mask: the band, and with ``segment_ids``
    (``(batch or 1, n_k)`` or ``(n_k,)``, aligned with the keys: query ``i`` has the id of key
    ``q_offset + i``) equal ids. Shapes as the kernel's."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if window is not None:
        mask = band_mask(q.shape[2], k.shape[2], window, q_offset, device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    if segment_ids is not None:
        ids = segment_ids.reshape(-1, k.shape[2])
        same = ids[:, q_offset : q_offset + q.shape[2], None] == ids[:, None, :]  # (batch or 1, n_q, n_k)
        scores = scores.masked_fill(~same[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
