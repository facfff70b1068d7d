"""The compute dtype under autocast, so that what crosses the wire is no wider than what is computed.

Under ``torch.autocast`` the linear layers and attention compute in the autocast dtype (bf16,
say) while LayerNorm returns fp32. A normed activation that is sent to another rank only to
enter a linear layer there (``shard_sequence``'s halo, ``shard_channels``' all-gathers) or to
enter attention (q, k and v) would be rounded to the compute dtype on arrival anyway; rounding
it before sending gives the same numbers for half the bytes. Parameters, their gradients and
the loss stay fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(x: Tensor) -> torch.dtype:
    """The autocast dtype of ``x``'s device when autocast is on there and ``x`` is floating
    point, else ``x.dtype``."""
    device = x.device.type
    if x.is_floating_point() and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def in_compute_dtype(x: Tensor) -> Tensor:
    """``x`` rounded to :func:`compute_dtype` (``x`` itself when that is its dtype; the cast's
    backward returns the gradient in ``x``'s dtype)."""
    return x.to(compute_dtype(x))
