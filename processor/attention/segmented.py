"""Sliding-window attention restricted to equal segment ids, in O(N·W), for every device and dtype.

Query ``i`` sits at key position ``q_offset + i`` and takes the id of that key; it attends to
key ``j`` iff ``|q_offset + i - j| <= W`` and the ids are equal, so it always sees itself.

- Banded: per batch element, query blocks of ``block`` rows each meet a band of
  ``block + 2W`` keys (strided views of the keys, zero-padded by ``W`` at both ends), under
  a per-block boolean mask built from the ids: band, key in range, equal ids. One SDPA call
  on ``(blocks, heads, rows, head_dim)``. The mask is ``N x (block + 2W)`` booleans, built
  per call and kept by SDPA's backward; nothing of size ``N x N`` is built, and no integer
  tensor beyond the ``N`` ids.
- When every query's window holds every key (``window=None`` or wider than the keys), each
  distinct id is attended on its own: its queries against its keys, cost the sum of squared
  segment lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def check_segment_ids(ids: Tensor, q: Tensor, k: Tensor) -> Tensor:
    """``ids`` as ``(b or 1, n_k)`` int64, or ``ValueError`` naming ``segment_ids``."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"segment_ids must be an integer tensor, got {ids.dtype}")
    ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[1] != k.shape[2] or ids.shape[0] not in (1, q.shape[0]):
        raise ValueError(
            f"segment_ids must be (batch or 1, n_k) = ({q.shape[0]}, {k.shape[2]}) aligned with the keys, "
            f"got {tuple(ids.shape)}"
        )
    if ids.device != q.device:
        raise ValueError(f"segment_ids are on {ids.device}, q on {q.device}")
    return ids.long()


def segmented_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int | None,
    ids: Tensor,
    *,
    q_offset: int,
    block: int,
    dropout_p: float,
    scale: float | None,
    every_key: bool,
) -> Tensor:
    """``q`` ``(b, h, n_q, d)`` over ``k, v`` ``(b, h, n_k, d)`` with ``ids`` ``(b or 1, n_k)``
    aligned with the keys; ``every_key``: the window holds every key. ``(b, h, n_q, d)``."""
    outs = []
    for b in range(q.shape[0]):
        ids_b = ids[b if ids.shape[0] > 1 else 0]
        args = (q[b], k[b], v[b], ids_b, q_offset, dropout_p, scale)
        if every_key or window is None:
            outs.append(_per_segment(*args))
        else:
            outs.append(_banded(*args, window=window, block=block))
    return torch.stack(outs)


def _per_segment(
    q: Tensor, k: Tensor, v: Tensor, ids: Tensor, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    """``(h, n_q, d)``: each id's queries against that id's keys, every key in reach."""
    q_ids = ids[q_offset : q_offset + q.shape[1]]
    out = q.new_zeros(q.shape)
    for segment in torch.unique(q_ids).tolist():
        rows = (q_ids == segment).nonzero().squeeze(1)
        keys = (ids == segment).nonzero().squeeze(1)
        part = F.scaled_dot_product_attention(
            q.index_select(1, rows), k.index_select(1, keys), v.index_select(1, keys), dropout_p=dropout_p, scale=scale
        )
        out = out.index_copy(1, rows, part)
    return out


def _banded(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ids: Tensor,
    q_offset: int,
    dropout_p: float,
    scale: float | None,
    *,
    window: int,
    block: int,
) -> Tensor:
    """``(h, n_q, d)``: blocks of queries against their ``block + 2W`` key band."""
    heads, n_q, dim = q.shape
    if n_q == 0:
        return q.new_zeros(q.shape)
    n_k = k.shape[1]
    blocks = -(-n_q // block)
    band = block + 2 * window
    # Padded key row c holds key c - W; block i's band starts at padded row q_offset + i * block.
    right = q_offset + (blocks - 1) * block + band - (n_k + window)
    k_bands = _bands(F.pad(k, (0, 0, window, max(right, 0))), band, block, q_offset, blocks)
    v_bands = _bands(F.pad(v, (0, 0, window, max(right, 0))), band, block, q_offset, blocks)
    q_blocks = F.pad(q, (0, 0, 0, blocks * block - n_q)).view(heads, blocks, block, dim).transpose(0, 1)

    key_ids = F.pad(ids, (window, max(right, 0))).narrow(0, q_offset, (blocks - 1) * block + band)
    in_range = F.pad(torch.ones_like(ids, dtype=torch.bool), (window, max(right, 0)))
    in_range = in_range.narrow(0, q_offset, (blocks - 1) * block + band)
    query_ids = F.pad(ids[q_offset : q_offset + n_q], (0, blocks * block - n_q)).view(blocks, block, 1)
    rows = torch.arange(block, device=q.device)[:, None]
    cols = torch.arange(band, device=q.device)[None, :]
    in_band = (rows + window - cols).abs() <= window  # (block, band), the same for every block
    mask = (
        in_band
        & in_range.unfold(0, band, block)[:, None, :]
        & (query_ids == key_ids.unfold(0, band, block)[:, None, :])
    )
    mask[-1, block - (blocks * block - n_q) :] = True  # padding queries: any finite row, dropped below
    out = F.scaled_dot_product_attention(
        q_blocks, k_bands, v_bands, attn_mask=mask[:, None], dropout_p=dropout_p, scale=scale
    )
    return out.transpose(0, 1).reshape(heads, blocks * block, dim)[:, :n_q]


def _bands(padded: Tensor, band: int, block: int, first: int, blocks: int) -> Tensor:
    """``(h, rows, d)`` -> ``(blocks, h, band, d)`` overlapping views from padded row ``first``."""
    rows = padded.narrow(1, first, (blocks - 1) * block + band)
    return rows.unfold(1, band, block).permute(1, 0, 3, 2)
