"""flash-attn's native sliding window, used on CUDA when the ``flash-attn`` package is installed.

flash-attn aligns query ``i`` with key ``i + n_k - n_q`` (bottom-right) and lets it see keys
``[-left, +right]`` of that; our queries sit at ``q_offset + i``, so both sides shift by
``q_offset - (n_k - n_q)``.
"""

from __future__ import annotations

from torch import Tensor

try:  # the flash-attn package has a native sliding window on CUDA (fp16/bf16)
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - CPU machines
    flash_attn_func = None


def flash_installed() -> bool:
    return flash_attn_func is not None


def flash_window_sides(n_q: int, n_k: int, window: int, q_offset: int) -> tuple[int, int]:
    """flash-attn's ``window_size=(left, right)`` for our band (either may come out negative:
    then flash-attn cannot express it)."""
    shift = q_offset - (n_k - n_q)
    return window + shift, window - shift


def flash_window_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, q_offset: int, dropout_p: float, scale: float | None
) -> Tensor:
    """``q`` ``(b, h, n_q, d)`` over ``k, v`` ``(b, h, n_k, d)`` within ``window``: ``(b, h, n_q, d)``."""
    left, right = flash_window_sides(q.shape[2], k.shape[2], window, q_offset)
    out = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        dropout_p=dropout_p,
        softmax_scale=scale,
        window_size=(left, right),
    )
    return out.transpose(1, 2)
