"""Differentiable all-to-all: the one collective that ``shard_heads`` is built on.

Backward of an all-to-all is the all-to-all with send and receive splits swapped.
Tensors are flat so that chunks for different ranks may have different trailing shapes
(uneven point shards *and* uneven head shards), which gloo's list ``all_to_all`` rejects.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.comm_stats import record_sent


def _all_to_all_flat(x: Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup) -> Tensor:
    rank = dist.get_rank(group)
    out = x.new_empty(sum(recv_splits))
    dist.all_to_all_single(
        out, x.contiguous(), output_split_sizes=recv_splits, input_split_sizes=send_splits, group=group
    )
    record_sent("all_to_all", (sum(send_splits) - send_splits[rank]) * x.element_size())
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send_splits: list[int], recv_splits: list[int], group) -> Tensor:  # type: ignore[override]
        ctx.send_splits, ctx.recv_splits, ctx.group = send_splits, recv_splits, group
        return _all_to_all_flat(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return _all_to_all_flat(grad, ctx.recv_splits, ctx.send_splits, ctx.group), None, None, None


def all_to_all(x: Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup) -> Tensor:
    """Exchange chunks of a flat tensor with every rank of ``group``.

    Args:
        x: ``(sum(send_splits),)``, the chunk for rank ``r`` at ``x[offset_r : offset_r + send_splits[r]]``.
        send_splits: elements sent to each rank.
        recv_splits: elements received from each rank.
    Returns:
        ``(sum(recv_splits),)``: the chunks received, in rank order.
    """
    if x.dim() != 1 or x.numel() != sum(send_splits):
        raise ValueError(f"all_to_all needs a flat tensor of {sum(send_splits)} elements, got {tuple(x.shape)}")
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)
