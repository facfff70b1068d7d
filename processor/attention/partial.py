"""Attention of a block of queries over a block of keys held elsewhere, with its log-sum-exp.

The ring (:mod:`processor.distributed.ring`) computes a rank's attention one key block at a
time: each block gives a partial output and the log-sum-exp of its scores, and
:func:`merge_partial` folds the partials into the exact softmax over every key. Backward needs
no partials: given the *merged* output and log-sum-exp, the softmax gradient of each block is
exact on its own (``P = exp(S - lse)``, ``D = rowsum(dO * O)``), so
:func:`partial_attention_backward` returns that block's share of dq and its dk, dv.

Positions are global: query row ``i`` sits at ``q_start + i``, key row ``j`` at ``k_start + j``,
and the query sees the key if ``|q_start + i - k_start - j| <= window`` (``None``: always) and,
with segment ids, if their ids are equal. Query rows are cut into spans: rows that reach no
key are skipped (output 0, log-sum-exp ``-inf``), rows that reach every key go through one
unmasked call, the rest in chunks under an additive mask of at most ``_MASK_ELEMENTS``.

On CPU in fp32 and bf16, where it is built, the whole block is one call of the fused C++
kernel (:mod:`processor.attention.native`: any offset between the blocks, the queries' own
segment ids); in float64 PyTorch's fused flash kernel and its backward (the ones
:mod:`processor.attention.banded` uses); elsewhere, and whenever a softcap or ALiBi
(:class:`~processor.attention.score_mods.ScoreMods`) changes the logits, an explicit chunked
softmax in float32 or better, at most ``_EXPLICIT_ELEMENTS`` scores per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from processor.attention.masks import additive
from processor.attention.native import native_available, native_backward, native_forward
from processor.attention.score_mods import ScoreMods, modify_scores, softcap_backward

_MASK_ELEMENTS = 1 << 21  # per chunk: 8 MiB of float32 mask
# Scores per piece on the explicit path: 1 MiB of float32, which stays in cache through the
# piece's dozen elementwise passes (measured on one CPU thread, N = 8192, 8 heads of 32, W = 256,
# fwd+bwd with ALiBi: 2^18 took 0.57x the time of 2^21, 2^17 and 2^19 0.64x and 0.69x).
_EXPLICIT_ELEMENTS = 1 << 18
_Placed = tuple[ScoreMods, Tensor, Tensor]  # a softcap and ALiBi, with the global query and key positions
_forward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_backward_op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@dataclass(frozen=True)
class BlockPair:
    """A query block meeting a key block: global positions of their first rows, the window,
    and the segment ids of each (``(rows, n_q)`` and ``(rows, n_k)``, rows 1 or the batch)."""

    q_start: int
    k_start: int
    window: int | None
    q_ids: Tensor | None = None
    k_ids: Tensor | None = None


@dataclass(frozen=True)
class _Span:
    """Query rows ``[q_lo, q_hi)`` against key rows ``[k_lo, k_hi)``; ``masked``: needs a mask."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    masked: bool


def _spans(pair: BlockPair, n_q: int, n_k: int, q: Tensor, modded: bool) -> list[_Span]:
    """The calls that cover every (query, key) pair in reach, in query order. The explicit
    path (not :func:`_fused`) cuts every span into pieces of at most ``_EXPLICIT_ELEMENTS`` scores,
    a masked piece against the keys its own rows reach."""
    spans = _plan(pair, n_q, n_k)
    if _fused(q, modded):
        return spans
    pieces = []
    for s in spans:
        rows = max(1, _EXPLICIT_ELEMENTS // max(q.shape[0] * q.shape[1] * (s.k_hi - s.k_lo), 1))
        for a in range(s.q_lo, s.q_hi, rows):
            b = min(a + rows, s.q_hi)
            k_lo, k_hi = _key_range(pair, a, b, n_k) if s.masked else (s.k_lo, s.k_hi)
            pieces.append(_Span(a, b, k_lo, k_hi, s.masked))
    return pieces


def _plan(pair: BlockPair, n_q: int, n_k: int) -> list[_Span]:
    ids = pair.q_ids is not None
    if n_q == 0 or n_k == 0:
        return []
    if pair.window is None:
        return _chunked(pair, 0, n_q, n_k) if ids else [_Span(0, n_q, 0, n_k, False)]
    w, shift = pair.window, pair.q_start - pair.k_start  # query i sits at key position i + shift
    reach_lo, reach_hi = _clip(-w - shift, n_q), _clip(n_k + w - shift, n_q)  # rows reaching a key
    full_lo, full_hi = _clip(n_k - 1 - w - shift, n_q), _clip(w - shift + 1, n_q)  # rows reaching all
    full_lo, full_hi = max(full_lo, reach_lo), min(full_hi, reach_hi)
    if full_lo >= full_hi or ids:
        return _chunked(pair, reach_lo, reach_hi, n_k)
    spans = _chunked(pair, reach_lo, full_lo, n_k)
    spans.append(_Span(full_lo, full_hi, 0, n_k, False))
    return spans + _chunked(pair, full_hi, reach_hi, n_k)


def _covers(span: _Span, n_q: int, n_k: int) -> bool:
    """An unmasked span of every query against every key."""
    return not span.masked and (span.q_lo, span.q_hi, span.k_lo, span.k_hi) == (0, n_q, 0, n_k)


def _clip(row: int, n: int) -> int:
    return min(max(row, 0), n)


def _chunked(pair: BlockPair, lo: int, hi: int, n_k: int) -> list[_Span]:
    """Masked spans over query rows ``[lo, hi)``, each with the key rows its rows reach."""
    spans = []
    rows = max(16, _MASK_ELEMENTS // max(n_k, 1))
    for a in range(lo, hi, rows):
        b = min(a + rows, hi)
        k_lo, k_hi = _key_range(pair, a, b, n_k)
        spans.append(_Span(a, b, k_lo, k_hi, True))
    return spans


def _key_range(pair: BlockPair, a: int, b: int, n_k: int) -> tuple[int, int]:
    if pair.window is None:
        return 0, n_k
    shift = pair.q_start - pair.k_start
    return _clip(a + shift - pair.window, n_k), _clip(b - 1 + shift + pair.window + 1, n_k)


def _allowed(pair: BlockPair, span: _Span, device: torch.device) -> Tensor:
    """``(rows, 1, span queries, span keys)`` bool: in the window and of equal ids."""
    q_pos = torch.arange(span.q_lo, span.q_hi, device=device) + pair.q_start
    k_pos = torch.arange(span.k_lo, span.k_hi, device=device) + pair.k_start
    if pair.window is None:
        allowed = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool, device=device)
    else:
        allowed = (q_pos[:, None] - k_pos[None, :]).abs() <= pair.window
    if pair.q_ids is not None and pair.k_ids is not None:
        q_ids, k_ids = pair.q_ids[:, span.q_lo : span.q_hi], pair.k_ids[:, span.k_lo : span.k_hi]
        allowed = allowed & (q_ids[:, :, None] == k_ids[:, None, :])
    else:
        allowed = allowed[None]
    return allowed[:, None]


def _fused(q: Tensor, modded: bool) -> bool:
    """Whether PyTorch's fused CPU kernel runs the call: full precision on CPU, logits unchanged."""
    return not modded and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)


def _native(q: Tensor, modded: bool) -> bool:
    """Whether the fused C++ kernel runs the block: CPU, fp32 or bf16, logits unchanged, built."""
    return not modded and q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16) and native_available()


def _native_geometry(pair: BlockPair, n_q: int, n_k: int) -> tuple[int, int]:
    """The kernel's window and query offset for ``pair``: a global window as one that reaches
    every key of the block from every query."""
    offset = pair.q_start - pair.k_start
    return (n_q + n_k + abs(offset) if pair.window is None else pair.window), offset


def _modded(mods: ScoreMods | None) -> bool:
    return mods is not None and mods.active


def _placed(mods: ScoreMods | None, pair: BlockPair, span: _Span, device: torch.device) -> _Placed | None:
    """``mods`` with the global positions of the span's queries and keys, or None without any."""
    if not _modded(mods):
        return None
    assert mods is not None
    q_pos = torch.arange(span.q_lo, span.q_hi, device=device) + pair.q_start
    return mods, q_pos, torch.arange(span.k_lo, span.k_hi, device=device) + pair.k_start


def partial_attention(
    q: Tensor, k: Tensor, v: Tensor, pair: BlockPair, scale: float | None = None, mods: ScoreMods | None = None
) -> tuple[Tensor, Tensor]:
    """Softmax attention of ``q`` over the keys of this block only.

    Args:
        q: ``(batch, heads, n_q, head_dim)``; k, v: ``(batch, heads, n_k, head_dim)``.
        mods: softcap and ALiBi slopes of ``q``'s heads, or None.
    Returns:
        ``out`` ``(batch, heads, n_q, head_dim)`` (0 where a query reaches no key) and ``lse``
        ``(batch, heads, n_q)`` in float32 or better (``-inf`` there).
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    b, h, n_q, d = q.shape
    if _native(q, _modded(mods)):
        window, offset = _native_geometry(pair, n_q, k.shape[2])
        return native_forward(q, k, v, window, offset, scale, pair.k_ids, pair.q_ids)
    spans = _spans(pair, n_q, k.shape[2], q, _modded(mods))
    if len(spans) == 1 and _covers(spans[0], n_q, k.shape[2]):  # one call: its buffers are the result
        return _span_forward(q, k, v, None, scale, _placed(mods, pair, spans[0], q.device))
    out = q.new_zeros(b, h, n_q, d)
    lse = q.new_full((b, h, n_q), float("-inf"), dtype=_lse_dtype(q))
    for span in spans:
        qs, ks = slice(span.q_lo, span.q_hi), slice(span.k_lo, span.k_hi)
        allowed = _allowed(pair, span, q.device) if span.masked else None
        placed = _placed(mods, pair, span, q.device)
        o, part_lse = _span_forward(q[:, :, qs], k[:, :, ks], v[:, :, ks], allowed, scale, placed)
        if allowed is not None:  # rows whose every key is masked: no contribution
            no_key = ~allowed.any(-1)
            part_lse = part_lse.masked_fill(no_key, float("-inf"))
            o = o.masked_fill(no_key[..., None], 0.0)
        out[:, :, qs], lse[:, :, qs] = o, part_lse
    return out, lse


def partial_attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    pair: BlockPair,
    scale: float | None = None,
    mods: ScoreMods | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """This block's share of the gradient, given the *merged* ``out`` and ``lse`` over every
    key block (shapes as :func:`partial_attention`): ``dq`` (this block's term), ``dk``, ``dv``."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if _native(q, _modded(mods)):
        window, offset = _native_geometry(pair, q.shape[2], k.shape[2])
        return native_backward(grad_out, q, k, v, out, lse, window, offset, scale, pair.k_ids, pair.q_ids)
    spans = _spans(pair, q.shape[2], k.shape[2], q, _modded(mods))
    if len(spans) == 1 and _covers(spans[0], q.shape[2], k.shape[2]):
        placed = _placed(mods, pair, spans[0], q.device)
        return _span_backward(grad_out, q, k, v, out, lse, None, scale, placed)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for span in spans:
        qs, ks = slice(span.q_lo, span.q_hi), slice(span.k_lo, span.k_hi)
        allowed = _allowed(pair, span, q.device) if span.masked else None
        grads = _span_backward(
            grad_out[:, :, qs],
            q[:, :, qs],
            k[:, :, ks],
            v[:, :, ks],
            out[:, :, qs],
            lse[:, :, qs],
            allowed,
            scale,
            _placed(mods, pair, span, q.device),
        )
        dq[:, :, qs] += grads[0]
        dk[:, :, ks] += grads[1]
        dv[:, :, ks] += grads[2]
    return dq, dk, dv


def merge_partial(out: Tensor, lse: Tensor, part_out: Tensor, part_lse: Tensor) -> None:
    """Fold a partial result into ``(out, lse)`` in place: the softmax over both key sets.
    ``lse`` must be finite (it holds a block every query reaches: its own)."""
    merged = torch.logaddexp(lse, part_lse)
    out.mul_(torch.exp(lse - merged).unsqueeze(-1).to(out.dtype))
    out.add_(part_out * torch.exp(part_lse - merged).unsqueeze(-1).to(out.dtype))
    lse.copy_(merged)


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _span_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    scale: float,
    placed: _Placed | None,
) -> tuple[Tensor, Tensor]:
    if _fused(q, placed is not None):
        mask = None if allowed is None else additive(allowed, q.dtype)
        return _forward_op(q, k, v, attn_mask=mask, scale=scale)
    scores, _ = _scores(q, k, allowed, scale, placed)
    lse = torch.logsumexp(scores, dim=-1)
    probs = scores.sub_(lse.nan_to_num(0.0, neginf=0.0).unsqueeze(-1)).exp_()
    return (probs.to(v.dtype) @ v), lse


def _span_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    allowed: Tensor | None,
    scale: float,
    placed: _Placed | None,
) -> tuple[Tensor, Tensor, Tensor]:
    if _fused(q, placed is not None):
        mask = None if allowed is None else additive(allowed, q.dtype)
        return _backward_op(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale)
    scores, capped = _scores(q, k, allowed, scale, placed, keep_tanh=True)
    probs = scores.sub_(lse.unsqueeze(-1)).exp_()
    dv = probs.transpose(-1, -2).to(grad_out.dtype) @ grad_out
    wide = _lse_dtype(q)
    delta = (grad_out.to(wide) * out.to(wide)).sum(-1, keepdim=True)
    dscores = softcap_backward((grad_out @ v.transpose(-1, -2)).to(wide).sub_(delta).mul_(probs), capped)
    dq = (dscores.to(k.dtype) @ k) * scale
    dk = (dscores.transpose(-1, -2).to(q.dtype) @ q) * scale
    return dq, dk, dv


def _scores(
    q: Tensor,
    k: Tensor,
    allowed: Tensor | None,
    scale: float,
    placed: _Placed | None,
    keep_tanh: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Masked logits ``(b, h, n_q, n_k)`` in float32 or better, and the softcap's tanh when
    ``keep_tanh`` (else None)."""
    scores = (q @ k.transpose(-1, -2)).to(_lse_dtype(q)) * scale
    capped = None
    if placed is not None:
        scores, capped = modify_scores(scores, *placed, keep_tanh=keep_tanh)
    return (scores if allowed is None else scores.masked_fill_(~allowed, float("-inf"))), capped
