"""Sliding-window self-attention in O(N·W) time and memory, forward and backward: the one
entry point, :func:`sliding_window_attention`, which checks its tensors and routes each call to
a path (:mod:`processor.attention.dispatch` holds the rules).

Query ``i`` sits at key position ``q_offset + i`` and attends to keys ``j`` with
``|q_offset + i - j| <= window`` (``window=None``: every key). ``q_offset`` lets a rank attend
from its own rows into a halo-padded key block without computing the halo rows' queries.

The paths: the fused C++ CPU kernel (:mod:`processor.attention.native`), the CPU banded flash
kernel (:mod:`processor.attention.banded`), SDPA on blocks of queries against views of their key
bands (:mod:`processor.attention.sdpa_blocks`), flash-attn's sliding window
(:mod:`processor.attention.flash`), FlexAttention's block-sparse kernel
(:mod:`processor.attention.flex`), and the score-modifying ``scored`` path
(:mod:`processor.attention.scored`). When every query's window holds every key, the fused C++
kernel over all keys on CPU, else one dense SDPA call (per segment id, with ids). Autograd saves
only q, k, v, the output and its log-sum-exp (or what the path's docstring says).

Segment ids (``segment_ids``, ``(batch or 1, n_k)`` integers aligned with the keys) further
restrict each query to keys of its own id; flash-attn (no ids support) is skipped when ids are
given.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from processor.attention.dispatch import AttentionCall, choose_global_path, choose_path, sees_every_key
from processor.attention.flash import flash_window_attention
from processor.attention.flex import flex_window_attention
from processor.attention.native import NativeBandAttention
from processor.attention.score_mods import ScoreMods
from processor.attention.scored import scored_window_attention
from processor.attention.sdpa_blocks import band_attention, blocked_attention, per_segment
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


def _native_scale(q: Tensor, scale: float | None) -> float:
    return 1 / math.sqrt(q.shape[-1]) if scale is None else scale


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
            ``ValueError`` when it cannot run these tensors). Global windows run ``native`` (forced,
            or ``auto`` on CPU where it is built, from 32 keys, without dropout or ids) or ``dense``
            (:func:`~processor.attention.dispatch.choose_global_path`; with ``mods``, what ``auto``
            picks for them).
        mods: a softcap and the ALiBi slopes of ``q``'s heads
            (:class:`~processor.attention.score_mods.ScoreMods`): run by ``scored`` or ``flex`` only.
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
    if sees_every_key(n_q, n_k, window, q_offset):
        return _global(q, k, v, q_offset, dropout_p, scale, ids, path)
    assert window is not None
    chosen = choose_path(AttentionCall.of(q, k, v, window, q_offset, ids is not None, dropout_p), path)
    if chosen == "flash_attn":
        return flash_window_attention(q, k, v, window, q_offset, dropout_p, scale)
    if chosen == "flex":
        return flex_window_attention(q, k, v, window, q_offset, scale, ids)
    if chosen == "scored":
        return scored_window_attention(q, k, v, window, q_offset, scale, ids)
    if chosen == "native":  # every query, edges included, in one call
        return NativeBandAttention.apply(q, k, v, window, q_offset, _native_scale(q, scale), ids)
    block = block_size or default_block_size(window)
    if chosen == "dense" or n_q <= 2 * block:  # one masked call: forced, or too short to block
        return band_attention(q, k, v, window, q_offset, dropout_p, scale, ids)
    return blocked_attention(q, k, v, window, q_offset, block, dropout_p, scale, ids, banded=chosen == "banded")


def _global(
    q: Tensor, k: Tensor, v: Tensor, q_offset: int, dropout_p: float, scale: float | None, ids: Tensor | None, path: str
) -> Tensor:
    """Attention of every query ``(batch, heads, n_q, head_dim)`` over every key ``(batch, heads,
    n_k, head_dim)`` (of its segment id, with ``ids`` ``(1 or batch, n_k)``) -> ``(batch, heads,
    n_q, head_dim)``: the native kernel with a window of all the keys, or SDPA
    (:func:`~processor.attention.dispatch.choose_global_path`)."""
    n_q, n_k = q.shape[2], k.shape[2]
    call = AttentionCall.of(q, k, v, n_k, q_offset, ids is not None, dropout_p)
    if n_q > 0 and choose_global_path(call, path) == "native":
        return NativeBandAttention.apply(q, k, v, n_k, q_offset, _native_scale(q, scale), ids)
    if ids is not None:
        return per_segment(q, k, v, ids, q_offset, dropout_p, scale)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)


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
