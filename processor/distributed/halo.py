"""Halo padding: extend a rank's block of points with the rows its window reaches.

Rank ``r`` holding global rows ``[s, e)`` needs ``[max(0, s - W), s)`` on the left and
``[e, min(N, e + W))`` on the right. When every shard is at least ``W`` long those come
from the two neighbour ranks only; a window wider than a neighbour's shard is still exact,
because the plan gathers the halo from as many ranks as it spans. There is no wrap-around:
the first and last ranks have no halo on their outer side.

The exchange is point-to-point (``batch_isend_irecv``), one message per (sender, receiver)
pair. Its backward sends each halo row's gradient home, where it is added to the owner's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.comm_stats import record_sent
from processor.distributed.shards import ShardLayout


@dataclass(frozen=True)
class HaloConfig:
    """Halo of ``width`` rows on each side of the points dimension ``dim`` (None: all rows)."""

    width: int | None
    dim: int = 1

    def __post_init__(self) -> None:
        if self.width is not None and self.width < 0:
            raise ValueError(f"halo width must be >= 0 or None, got {self.width}")


def halo_extent(layout: ShardLayout, width: int | None) -> tuple[int, int]:
    """Rows of halo this rank gets on its left and right: ``(min(W, start), min(W, N - stop))``."""
    w = layout.total if width is None else width
    return min(w, layout.start), min(w, layout.total - layout.stop)


@dataclass(frozen=True)
class Transfer:
    """Rows ``[start, stop)`` moving to or from ``peer`` (a rank of the group)."""

    peer: int
    start: int
    stop: int


@dataclass(frozen=True)
class HaloPlan:
    """Who sends what to whom. Send rows are local indices, receive rows padded indices."""

    left: int
    right: int
    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]

    @classmethod
    def build(cls, layout: ShardLayout, width: int | None) -> HaloPlan:
        n = layout.total
        w = n if width is None else width
        starts, sizes = layout.offsets, layout.sizes

        def needed(r: int) -> list[tuple[int, int]]:
            s, e = starts[r], starts[r] + sizes[r]
            return [(max(0, s - w), s), (e, min(n, e + w))]

        me_start, me_stop = layout.start, layout.stop
        left, right = halo_extent(layout, width)
        padded_origin = me_start - left
        sends, recvs = [], []
        for peer in range(layout.world_size):
            if peer == layout.rank:
                continue
            p_start, p_stop = starts[peer], starts[peer] + sizes[peer]
            for a, b in needed(layout.rank):
                lo, hi = max(a, p_start), min(b, p_stop)
                if lo < hi:
                    recvs.append(Transfer(peer, lo - padded_origin, hi - padded_origin))
            for a, b in needed(peer):
                lo, hi = max(a, me_start), min(b, me_stop)
                if lo < hi:
                    sends.append(Transfer(peer, lo - me_start, hi - me_start))
        return cls(left, right, tuple(sends), tuple(recvs))


_local_copy = [False]  # process-wide: autograd runs backward on another thread


@contextmanager
def exchange_as_local_copy() -> Iterator[None]:
    """Benchmark mode: inside the block every halo exchange copies the bytes it would send into
    a local buffer and zero-fills what it would receive, sending nothing. Results are wrong;
    the step time against a real exchange is what the communication costs after overlap."""
    _local_copy[0] = True
    try:
        yield
    finally:
        _local_copy[0] = False


def _exchange(outgoing: list[tuple[int, Tensor]], incoming: list[tuple[int, Tensor]], group: dist.ProcessGroup) -> None:
    """Post all sends and receives at once and wait for them (tensors must be contiguous)."""
    if _local_copy[0]:
        for _, t in outgoing:
            t.clone()
        for _, t in incoming:
            t.zero_()
        return
    ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(group, p), group) for p, t in outgoing]
    ops += [dist.P2POp(dist.irecv, t, dist.get_global_rank(group, p), group) for p, t in incoming]
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    record_sent("halo", sum(t.numel() * t.element_size() for _, t in outgoing))


def _rows(x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    return x.narrow(dim, start, stop - start)


def _buffer_like(x: Tensor, dim: int, rows: int) -> Tensor:
    shape = list(x.shape)
    shape[dim] = rows
    return x.new_empty(shape)


class _HaloPad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, plan: HaloPlan, dim: int, group) -> Tensor:  # type: ignore[override]
        ctx.plan, ctx.dim, ctx.group, ctx.local = plan, dim, group, x.shape[dim]
        outgoing = [(t.peer, _rows(x, dim, t.start, t.stop).contiguous()) for t in plan.sends]
        incoming = [(t.peer, _buffer_like(x, dim, t.stop - t.start)) for t in plan.recvs]
        _exchange(outgoing, incoming, group)
        shape = list(x.shape)
        shape[dim] += plan.left + plan.right
        padded = x.new_empty(shape)
        _rows(padded, dim, plan.left, plan.left + x.shape[dim]).copy_(x)
        for t, (_, buf) in zip(plan.recvs, incoming):
            _rows(padded, dim, t.start, t.stop).copy_(buf)
        return padded

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        plan, dim = ctx.plan, ctx.dim
        grad_local = _rows(grad, dim, plan.left, plan.left + ctx.local).clone()
        outgoing = [(t.peer, _rows(grad, dim, t.start, t.stop).contiguous()) for t in plan.recvs]
        incoming = [(t.peer, _buffer_like(grad, dim, t.stop - t.start)) for t in plan.sends]
        _exchange(outgoing, incoming, ctx.group)
        for t, (_, buf) in zip(plan.sends, incoming):
            _rows(grad_local, dim, t.start, t.stop).add_(buf)
        return grad_local, None, None, None


def halo_pad(x: Tensor, config: HaloConfig, layout: ShardLayout, group: dist.ProcessGroup) -> Tensor:
    """Pad this rank's block of points with its halo from the other ranks.

    Args:
        x: local block, e.g. ``(batch, local_points, channels)`` with ``config.dim == 1``.
        layout: the split of points over ``group``; ``x.shape[dim]`` must be this rank's size.
    Returns:
        ``(batch, left + local_points + right, channels)``, where ``left = min(W, start)`` and
        ``right = min(W, N - stop)``: rows ``[start - left, stop + right)`` of the global tensor.
    """
    if x.shape[config.dim] != layout.local_size:
        raise ValueError(
            f"halo_pad: local tensor has {x.shape[config.dim]} points on dim {config.dim}, "
            f"the layout gives this rank {layout.local_size}"
        )
    plan = HaloPlan.build(layout, config.width)
    return _HaloPad.apply(x, plan, config.dim % x.dim(), group)
