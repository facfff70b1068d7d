"""Halo padding: extend a rank's block of points with the rows its window reaches.

Rank ``r`` holding global rows ``[s, e)`` needs ``[max(0, s - W), s)`` on the left and
``[e, min(N, e + W))`` on the right. When every shard is at least ``W`` long those come
from the two neighbour ranks only; a window wider than a neighbour's shard is still exact,
because the plan gathers the halo from as many ranks as it spans. There is no wrap-around:
the first and last ranks have no halo on their outer side.

The exchange is point-to-point (``batch_isend_irecv``), one message per (sender, receiver)
pair. Its backward sends each halo row's gradient home, where it is added to the owner's.
:func:`start_halo_exchange` posts it and returns at once, :meth:`HaloExchange.finish` waits,
so a caller overlaps it with work that needs no halo; :func:`halo_pad` does both in one go.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.ranges import profiler_range
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Posted, Transport


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


def _rows(x: Tensor, dim: int, start: int, stop: int) -> Tensor:
    return x.narrow(dim, start, stop - start)


def _buffer_like(x: Tensor, dim: int, rows: int) -> Tensor:
    shape = list(x.shape)
    shape[dim] = rows
    return x.new_empty(shape)


@dataclass
class _InFlight:
    """What the two halves of one exchange hand each other: the forward's posted exchange, then
    the backward's (posted by :class:`_FinishHalo`'s backward, awaited by :class:`_StartHalo`'s)."""

    plan: HaloPlan
    dim: int
    group: dist.ProcessGroup
    transport: Transport
    local_shape: tuple[int, ...]
    forward: Posted | None = None
    backward: Posted | None = None

    def halo_rows(self, left: Tensor, right: Tensor, t: Transfer) -> Tensor:
        """The rows of the left or right halo that transfer ``t`` (padded indices) covers."""
        if t.start < self.plan.left:
            return _rows(left, self.dim, t.start, t.stop)
        first = self.plan.left + self.local_shape[self.dim]
        return _rows(right, self.dim, t.start - first, t.stop - first)


class _StartHalo(torch.autograd.Function):
    """Forward: post the sends of this rank's boundary rows and the receives of its halo.
    Backward: wait for the gradients of the rows it sent and add them to the local gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, flight: _InFlight) -> Tensor:  # type: ignore[override]
        plan, dim = flight.plan, flight.dim
        ctx.flight = flight
        outgoing = [(t.peer, _rows(x, dim, t.start, t.stop).contiguous()) for t in plan.sends]
        incoming = [(t.peer, _buffer_like(x, dim, t.stop - t.start)) for t in plan.recvs]
        with profiler_range("halo_exchange/post"):
            flight.forward = flight.transport.post(outgoing, incoming, flight.group)
        return x.new_empty(0)  # a token: puts _FinishHalo after this node in the graph

    @staticmethod
    def backward(ctx, token: Tensor):  # type: ignore[override]
        flight = ctx.flight
        if flight.backward is None:
            raise RuntimeError("halo exchange: the gradient of its finish was never sent")
        with profiler_range("halo_exchange/grad_wait"):
            received = flight.backward.wait()
        flight.backward = None
        grad = token.new_zeros(flight.local_shape)
        for t, buf in zip(flight.plan.sends, received):
            _rows(grad, flight.dim, t.start, t.stop).add_(buf)
        return grad, None


class _FinishHalo(torch.autograd.Function):
    """Forward: wait for the halo and return its ``(left, right)`` rows.
    Backward: post the halo rows' gradients to their owners and return without waiting."""

    @staticmethod
    def forward(ctx, token: Tensor, flight: _InFlight) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        if flight.forward is None:
            raise RuntimeError("halo exchange: finish() was called twice")
        with profiler_range("halo_exchange/wait"):
            received = flight.forward.wait()
        flight.forward = None
        ctx.flight = flight
        plan = flight.plan
        left = [buf for t, buf in zip(plan.recvs, received) if t.start < plan.left]
        right = [buf for t, buf in zip(plan.recvs, received) if t.start >= plan.left]
        return _join(left, flight, token), _join(right, flight, token)

    @staticmethod
    def backward(ctx, grad_left: Tensor, grad_right: Tensor):  # type: ignore[override]
        flight = ctx.flight
        plan = flight.plan
        outgoing = [(t.peer, flight.halo_rows(grad_left, grad_right, t).contiguous()) for t in plan.recvs]
        incoming = [(t.peer, _buffer_like(grad_left, flight.dim, t.stop - t.start)) for t in plan.sends]
        with profiler_range("halo_exchange/grad_post"):
            flight.backward = flight.transport.post(outgoing, incoming, flight.group)
        return grad_left.new_empty(0), None


def _join(pieces: list[Tensor], flight: _InFlight, token: Tensor) -> Tensor:
    if len(pieces) == 1:
        return pieces[0]
    if pieces:
        return torch.cat(pieces, flight.dim)
    shape = list(flight.local_shape)
    shape[flight.dim] = 0
    return token.new_empty(shape)


@dataclass
class HaloExchange:
    """A halo exchange in flight, from :func:`start_halo_exchange`; :meth:`finish` waits for it.

    Work placed between the two overlaps the exchange, in forward and in backward: the
    backward of ``finish`` posts the halo rows' gradients to their owners and the backward of
    ``start`` waits for them, and autograd runs what was computed in between (later nodes
    first) while they travel.
    """

    plan: HaloPlan
    _token: Tensor
    _flight: _InFlight

    def finish(self) -> tuple[Tensor, Tensor]:
        """Wait for the halo: ``(left, right)`` rows, e.g. ``(batch, left, channels)`` and
        ``(batch, right, channels)``, globally just before and just after this rank's block."""
        return _FinishHalo.apply(self._token, self._flight)


def start_halo_exchange(
    x: Tensor, config: HaloConfig, layout: ShardLayout, group: dist.ProcessGroup, transport: Transport | None = None
) -> HaloExchange:
    """Post the exchange of ``x``'s halo with the other ranks and return without waiting.

    Args:
        x: local block, e.g. ``(batch, local_points, channels)`` with ``config.dim == 1``.
        layout: the split of points over ``group``; ``x.shape[dim]`` must be this rank's size.
        transport: what sends the bytes (default: torch.distributed on ``group``, uncounted).
    """
    dim = config.dim % x.dim()
    if x.shape[dim] != layout.local_size:
        raise ValueError(
            f"halo exchange: local tensor has {x.shape[dim]} points on dim {config.dim}, "
            f"the layout gives this rank {layout.local_size}"
        )
    plan = HaloPlan.build(layout, config.width)
    flight = _InFlight(plan, dim, group, transport or Transport(), tuple(x.shape))
    return HaloExchange(plan, _StartHalo.apply(x, flight), flight)


def halo_pad(
    x: Tensor, config: HaloConfig, layout: ShardLayout, group: dist.ProcessGroup, transport: Transport | None = None
) -> Tensor:
    """Pad this rank's block of points with its halo from the other ranks (arguments as
    :func:`start_halo_exchange`, which it starts and finishes at once).

    Returns:
        ``(batch, left + local_points + right, channels)``, where ``left = min(W, start)`` and
        ``right = min(W, N - stop)``: rows ``[start - left, stop + right)`` of the global tensor.
    """
    left, right = start_halo_exchange(x, config, layout, group, transport).finish()
    return torch.cat([left, x, right], dim=config.dim % x.dim())
