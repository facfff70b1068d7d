"""Counted FLOPs of the processor: useful work only (no recomputation, no masked-out scores).

Per layer forward, for N points, C channels, MLP ratio m: the q, k, v and output projections
``8 N C^2``, the MLP ``4 m N C^2`` (``24 N C^2`` with m = 4), and attention ``4 C`` per
(query, key) pair inside the window (``Q K^T`` and ``A V``, 2 FLOPs per multiply-add).
Backward costs twice the forward. Norms, softmax and activations are not counted.
"""

from __future__ import annotations


def window_pairs(n: int, window: int | None) -> int:
    """(query, key) pairs with ``|i - j| <= window`` among ``n`` points (``None``: all pairs)."""
    if window is None or window >= n - 1:
        return n * n
    # n (2W + 1) pairs in a full band, less the W (W + 1) / 2 missing at each end.
    return n * (2 * window + 1) - window * (window + 1)


def processor_flops(
    n: int, channels: int, window: int | None, num_layers: int, mlp_hidden_ratio: float, batch: int = 1
) -> int:
    """Useful FLOPs of one forward+backward of the processor on ``(batch, n, channels)``."""
    hidden = int(mlp_hidden_ratio * channels)
    dense = 2 * n * channels * (4 * channels) + 2 * n * channels * hidden * 2
    attention = 4 * channels * window_pairs(n, window)
    return 3 * batch * num_layers * (dense + attention)
