"""Summing parameter gradients over the model-parallel group.

Every rank holds all parameters (they are replicated; only points are split). After
backward, a rank's parameter gradients are the contributions of its own points, so the
gradient of the whole model is their **sum** over the model-parallel group; the
collectives' backward passes have already routed every cross-rank term to its rank.

With data parallelism on top, average over the data-parallel group as usual (DDP on the
data-parallel group does it) and *sum* over the model-parallel group with this function.
DDP over the whole world instead would average over ``dp * mp`` ranks: multiply by the
model-parallel size to undo that.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn


def all_reduce_gradients(
    parameters: Iterable[nn.Parameter], group: dist.ProcessGroup | None, divide_by: int = 1
) -> None:
    """In place: ``p.grad = (sum over the group's ranks of p.grad) / divide_by``, in one flat
    all-reduce.

    Parameters whose ``grad`` is None count as zero (and get a gradient) so that every
    rank reduces buffers of the same layout.
    """
    params = [p for p in parameters if p.requires_grad]
    if group is None or dist.get_world_size(group) == 1 or not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    if divide_by != 1:
        flat /= divide_by
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


def sum_model_parallel_gradients(parameters: Iterable[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """In place: ``p.grad = sum over the model-parallel group's ranks of p.grad``."""
    all_reduce_gradients(parameters, group)
