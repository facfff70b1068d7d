"""Counted FLOPs of the processor (useful work only: no recomputation, no masked-out scores),
and the activation memory its backward needs.

Per layer forward, for N points, C channels, MLP ratio m: the q, k, v and output projections
``8 N C^2``, the MLP ``4 m N C^2`` (``24 N C^2`` with m = 4), and attention ``4 C`` per
(query, key) pair inside the window (``Q K^T`` and ``A V``, 2 FLOPs per multiply-add).
Backward costs twice the forward. Norms, softmax and activations are not counted.
"""

from __future__ import annotations

from processor.config import mlp_hidden_channels
from processor.strategies.base import Strategy
from processor.strategies.cost import Workload


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
    hidden = mlp_hidden_channels(channels, mlp_hidden_ratio)
    dense = 2 * n * channels * (4 * channels) + 2 * n * channels * hidden * 2
    attention = 4 * channels * window_pairs(n, window)
    return 3 * batch * num_layers * (dense + attention)


def saved_activation_bytes(work: Workload, strategy: Strategy) -> int:
    """Bytes autograd must keep per rank between forward and backward (fp32).

    Per point and layer: the block input (LayerNorm 1 backward), the normed input (q, k, v
    projection), q, k and v (attention backward), the attention output (one point-major tensor:
    the fused kernel's backward and the output projection both read it), the residual
    (LayerNorm 2), its normed value (MLP input) and the hidden pre-activation: ``8 C + hidden``
    values (the GELU MLP recomputes its post-activation in backward; other activations keep it:
    ``8 C + 2 hidden``), plus per-head log-sum-exp and the two LayerNorms' mean and rstd; and
    what the strategy keeps beyond its points (:meth:`~processor.strategies.cost.StrategyCost.kept_values_per_layer`:
    ``shard_sequence``'s halo rows' k and v). With checkpointing only the chunk inputs and one
    chunk's activations are kept.
    """
    c, h, n, ranks = work.num_channels, work.num_heads, work.points, work.ranks
    hidden = mlp_hidden_channels(c, work.mlp_hidden_ratio)
    local = -(-n // ranks)
    hidden_kept = hidden if work.activation in ("gelu", "gelu_tanh") else 2 * hidden
    per_point = 8 * c + hidden_kept + h + 4
    per_layer = local * per_point + (strategy.kept_values_per_layer(work) if ranks > 1 else 0)
    layers = work.num_layers
    if work.num_chunks > 0:
        per_chunk = layers // work.num_chunks
        return 4 * work.batch * (work.num_chunks * local * c + per_chunk * per_layer)
    return 4 * work.batch * layers * per_layer
