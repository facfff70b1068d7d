"""Differentiable all-to-all: the one collective that ``shard_heads`` is built on.

Backward of an all-to-all is the all-to-all with send and receive splits swapped.
Tensors are flat so that chunks for different ranks may have different trailing shapes
(uneven point shards *and* uneven head shards), which gloo's list ``all_to_all`` rejects.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.ranges import profiler_range
from processor.distributed.transport import Transport


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send_splits: list[int], recv_splits: list[int], group, transport) -> Tensor:  # type: ignore[override]
        ctx.send_splits, ctx.recv_splits, ctx.group, ctx.transport = send_splits, recv_splits, group, transport
        return _exchange(transport, x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        grad_x = _exchange(ctx.transport, grad, ctx.recv_splits, ctx.send_splits, ctx.group)
        return grad_x, None, None, None, None


def _exchange(transport: Transport, x: Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> Tensor:
    """Flat ``x`` ``(sum(send),)`` -> ``(sum(recv),)``, under the primitive's profiler range."""
    with profiler_range("all_to_all"):
        return transport.all_to_all(x, send, recv, group)


def all_to_all(
    x: Tensor,
    send_splits: list[int],
    recv_splits: list[int],
    group: dist.ProcessGroup,
    transport: Transport | None = None,
) -> Tensor:
    """Exchange chunks of a flat tensor with every rank of ``group``.

    Args:
        x: ``(sum(send_splits),)``, the chunk for rank ``r`` at ``x[offset_r : offset_r + send_splits[r]]``.
        send_splits: elements sent to each rank.
        recv_splits: elements received from each rank.
        transport: what sends the bytes (default: torch.distributed on ``group``, uncounted).
    Returns:
        ``(sum(recv_splits),)``: the chunks received, in rank order.
    """
    if x.dim() != 1 or x.numel() != sum(send_splits):
        raise ValueError(f"all_to_all needs a flat tensor of {sum(send_splits)} elements, got {tuple(x.shape)}")
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group, transport or Transport())
