"""The sliding-window band as a mask: which keys each query sees, and how far a block reaches."""

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
