"""Sliding-window attention through FlexAttention, with a block-sparse ``BlockMask`` for the band.

FlexAttention (``torch.nn.attention.flex_attention``, compiled) visits only the
``(query block, key block)`` tiles a :class:`BlockMask` lists, so a window of ``W`` costs
``O(N·W)``. The mask is built here from the band's geometry, on the device, never as an
``N x N`` tensor: query block ``i`` (rows ``[i·B, (i+1)·B)`` at key positions ``q_offset + row``)
reaches key blocks ``floor((q_offset + i·B - W) / B)`` to ``floor((q_offset + (i+1)·B - 1 + W) / B)``;
the tiles wholly inside the band are *full* (no ``mask_mod`` evaluated), the rest *partial*.
With segment ids every tile is partial and the ``mask_mod`` adds ``ids[q] == ids[k]``.

The tile lists depend only on ``(n_q, n_k, W, q_offset, block, device)`` and are cached.
CUDA runs forward and backward; CPU runs forward only (torch has no CPU backward for it),
which is why :mod:`processor.attention.dispatch` picks it on CPU for inference alone.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from processor.attention.score_mods import ScoreMods

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - torch < 2.5
    BlockMask = flex_attention = None

#: Rows per query block and per key block of the BlockMask (FlexAttention's default tile).
FLEX_BLOCK = 128


def flex_available() -> bool:
    """Whether this torch has FlexAttention."""
    return flex_attention is not None


@functools.cache
def _compiled_flex():
    # Compiled once per process; without compiling, flex_attention materialises every score.
    return torch.compile(flex_attention)


def band_tiles(
    n_q: int, n_k: int, window: int, q_offset: int, block: int, device, split_full: bool = True
) -> tuple[Tensor, ...]:
    """The band's tiles: ``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)``,
    shaped ``(1, 1, q_blocks)`` and ``(1, 1, q_blocks, k_blocks)`` (int32) as ``BlockMask`` takes them:
    ``O((N / block)^2)`` integers (72 MB at n320's 542 080 points on one rank), never ``N x N``.

    A tile is full when every query of the block sees every key of it; tiles cut by the end of
    the queries or keys (a ragged last block) count as partial, and so does every tile when
    ``split_full`` is False (segment ids may cut any tile).
    """
    return _band_tiles(n_q, n_k, window, q_offset, block, str(torch.device(device)), split_full)


@functools.lru_cache(maxsize=256)
def _band_tiles(
    n_q: int, n_k: int, window: int, q_offset: int, block: int, device: str, split_full: bool
) -> tuple[Tensor, ...]:
    q_blocks, k_blocks = -(-n_q // block), -(-n_k // block)
    rows = torch.arange(q_blocks, device=device)
    q_first = q_offset + rows * block
    q_last = q_offset + torch.clamp((rows + 1) * block, max=n_q) - 1
    lo = torch.clamp(q_first - window, min=0) // block
    hi = torch.clamp(q_last + window, max=n_k - 1) // block
    width = int((hi - lo).max().item()) + 1 if q_blocks else 1
    cand = lo[:, None] + torch.arange(width, device=device)[None, :]  # (q_blocks, width)
    in_band = cand <= hi[:, None]
    k_first = cand * block
    k_last = torch.clamp((cand + 1) * block, max=n_k) - 1
    whole = (q_last[:, None] - k_first <= window) & (k_last - q_first[:, None] <= window)
    whole &= (cand + 1) * block <= n_k  # a ragged last key block stays partial
    whole &= ((rows + 1) * block <= n_q)[:, None]  # so does a ragged last query block
    whole &= split_full
    full, partial = in_band & whole, in_band & ~whole
    cand = cand.clamp(max=k_blocks - 1)
    return (*_listed(cand, partial, k_blocks), *_listed(cand, full, k_blocks))


def _listed(cand: Tensor, chosen: Tensor, k_blocks: int) -> tuple[Tensor, Tensor]:
    """Per query block, the count of ``chosen`` candidates and their indices first, zero-padded
    to ``k_blocks`` (the BlockMask layout): ``(1, 1, q_blocks)`` and ``(1, 1, q_blocks, k_blocks)`` int32."""
    order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)
    indices = torch.zeros(cand.shape[0], max(k_blocks, cand.shape[1]), dtype=torch.int32, device=cand.device)
    indices[:, : cand.shape[1]] = torch.gather(cand, 1, order)
    return chosen.sum(1, dtype=torch.int32)[None, None], indices[:, :k_blocks][None, None].contiguous()


def band_block_mask(
    n_q: int,
    n_k: int,
    window: int,
    q_offset: int,
    device,
    batch: int = 1,
    ids: Tensor | None = None,
    block: int = FLEX_BLOCK,
) -> BlockMask:
    """The ``BlockMask`` of the band ``|q_offset + i - j| <= window`` for ``batch`` samples; with
    ``ids`` ``(1 or batch, n_k)`` also ``ids[q_offset + i] == ids[j]``."""
    tiles = band_tiles(n_q, n_k, window, q_offset, block, device, split_full=ids is None)
    # One mask_mod, its numbers and ids in tensors of fixed rank, and full-tile lists always
    # present (empty with ids): the compiled kernel is then reused across offsets, windows and
    # ids instead of recompiled for each (without ids, rows of zeros stand in).
    offset = torch.tensor(q_offset, device=device)
    reach = torch.tensor(window, device=device)
    last = torch.tensor(n_k - 1, device=device)
    if ids is None:
        ids = torch.zeros(batch, n_k, dtype=torch.int64, device=device)
    elif ids.shape[0] != batch:
        ids = ids.expand(batch, n_k).contiguous()

    def in_band_and_segment(b, h, q_idx, kv_idx):
        # Ragged last tiles evaluate rows past the ends: clamp the ids' index (those rows are
        # masked or dropped by FlexAttention anyway), so that no read leaves the ids.
        q_pos = torch.minimum(q_idx + offset, last)
        k_pos = torch.minimum(kv_idx, last)
        return ((q_idx + offset - kv_idx).abs() <= reach) & (ids[b, q_pos] == ids[b, k_pos])

    return BlockMask.from_kv_blocks(*tiles, BLOCK_SIZE=block, mask_mod=in_band_and_segment, seq_lengths=(n_q, n_k))


def flex_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    scale: float | None,
    ids: Tensor | None,
    mods: ScoreMods | None = None,
) -> Tensor:
    """``q`` ``(b, h, n_q, d)`` over ``k, v`` ``(b, h, n_k, d)`` within ``window`` through compiled
    FlexAttention; ``ids`` ``(rows, n_k)`` int64 or None; ``mods`` a softcap and ALiBi slopes
    of ``q``'s heads (a ``score_mod``), or None. ``(b, h, n_q, d)``."""
    mask = band_block_mask(q.shape[2], k.shape[2], window, q_offset, q.device, q.shape[0], ids)
    if mods is None or not mods.active:
        return _compiled_flex()(q, k, v, block_mask=mask, scale=scale)
    return _compiled_flex()(q, k, v, score_mod=_score_mod(mods, q_offset, q), block_mask=mask, scale=scale)


def _score_mod(mods: ScoreMods, q_offset: int, like: Tensor):
    """FlexAttention's ``score_mod`` for ``mods``: its numbers in tensors, so that the compiled
    kernel is reused across offsets and layers."""
    cap = torch.tensor(mods.softcap or 1.0, dtype=torch.float32, device=like.device)
    slopes = torch.zeros(like.shape[1], dtype=torch.float32, device=like.device)
    if mods.slopes is not None:
        slopes = mods.slopes.to(device=like.device, dtype=torch.float32)
    offset = torch.tensor(q_offset, device=like.device)
    softcap = mods.softcap is not None

    def modify(score, b, h, q_idx, kv_idx):
        if softcap:
            score = torch.tanh(score / cap) * cap
        return score - slopes[h] * (q_idx + offset - kv_idx).abs()

    return modify
