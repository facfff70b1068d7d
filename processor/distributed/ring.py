"""Ring passes: attention over the key blocks of other ranks, one block at a time.

Each rank keeps its queries; the keys and values of every rank whose block the window
reaches come to it point-to-point, one block per step, and each block's partial output is
folded in by its log-sum-exp (:mod:`processor.attention.partial`). Per rank that is
``O(N / P)`` memory plus two blocks in flight, for any window, global attention included.

Schedule (:class:`RingPlan`): step by step, ranks pair up. For each distance ``s = 1, 2, ...``
there are two steps; in the first, ranks ``r`` and ``r + s`` with ``r // s`` even swap their
blocks, in the second those with ``r // s`` odd. Each rank has at most one partner per step
and the pair meets at the same step on both sides, so every exchange is a symmetric swap
between two ranks (as the halo's), nearest blocks first, and pairs whose blocks lie farther
apart than the window are left out. Exact for uneven (or empty) shards.

Forward posts step ``t + 1``'s swap before computing step ``t``'s block, so the transfer
hides behind the compute. Backward runs the same steps again: the blocks travel once more
(nothing remote is kept from forward), each rank computes a remote block's dk, dv from its
own queries and the merged output and log-sum-exp, and swaps them home with its partner,
who adds them to its own; that swap is awaited one step later, behind the next block (one
such swap in flight at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from processor.attention.partial import BlockPair, merge_partial, partial_attention, partial_attention_backward
from processor.attention.score_mods import ScoreMods
from processor.distributed.ranges import profiler_range
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import Posted, Transport


def blocks_meet(layout: ShardLayout, a: int, b: int, window: int | None) -> bool:
    """Whether some point of rank ``a``'s block is within ``window`` of one of rank ``b``'s."""
    sizes, offsets = layout.sizes, layout.offsets
    if sizes[a] == 0 or sizes[b] == 0:
        return False
    if window is None:
        return True
    left, right = sorted((a, b))
    gap = offsets[right] - (offsets[left] + sizes[left] - 1)  # nearest points' distance
    return gap <= window


def reaches_beyond_neighbours(layout: ShardLayout, window: int | None) -> bool:
    """Whether some rank's window reaches a block two or more ranks away (the halo would then
    gather from several ranks: the ring's case)."""
    world = layout.world_size
    return any(blocks_meet(layout, a, b, window) for a in range(world) for b in range(a + 2, world))


@dataclass(frozen=True)
class RingPlan:
    """This rank's partners, in the order of the steps it takes part in."""

    partners: tuple[int, ...]

    @classmethod
    def build(cls, layout: ShardLayout, window: int | None) -> RingPlan:
        rank, world = layout.rank, layout.world_size
        partners = []
        for distance in range(1, world):
            for parity in (0, 1):
                for left in (rank, rank - distance):  # this rank as the pair's left or right end
                    right = left + distance
                    if left < 0 or right >= world or (left // distance) % 2 != parity:
                        continue
                    if blocks_meet(layout, left, right, window):
                        partners.append(right if left == rank else left)
        return cls(tuple(partners))


@dataclass(frozen=True)
class _Ring:
    """What both passes need: the split, the group, the window and the global segment ids."""

    layout: ShardLayout
    plan: RingPlan
    group: dist.ProcessGroup
    transport: Transport
    window: int | None
    scale: float
    segment_ids: Tensor | None  # (rows, N) every point's ids, or None
    mods: ScoreMods | None = None  # softcap and ALiBi slopes of this rank's heads

    def pair(self, peer: int) -> BlockPair:
        """This rank's queries against ``peer``'s keys."""
        me, start = self.layout.rank, self.layout.offsets
        ids = self.segment_ids
        if ids is None:
            return BlockPair(start[me], start[peer], self.window)
        return BlockPair(start[me], start[peer], self.window, self._ids(ids, me), self._ids(ids, peer))

    def _ids(self, ids: Tensor, rank: int) -> Tensor:
        a = self.layout.offsets[rank]
        return ids[:, a : a + self.layout.sizes[rank]]

    def swap(self, step: int, kv: Tensor) -> Posted | None:
        """Post the swap of step ``step``: this rank's ``kv`` ``(2, b, h, n, d)`` to the partner,
        a buffer for the partner's (its rows on dim 3) from it. None past the last step."""
        if step >= len(self.plan.partners):
            return None
        peer = self.plan.partners[step]
        shape = list(kv.shape)
        shape[3] = self.layout.sizes[peer]
        with profiler_range("ring/post"):
            return self.transport.post([(peer, kv)], [(peer, kv.new_empty(shape))], self.group, kind="ring")

    @staticmethod
    def receive(posted: Posted | None) -> Tensor:
        """Wait for a swap posted by :meth:`swap`: the partner's ``(2, b, h, n, d)`` block."""
        assert posted is not None
        with profiler_range("ring/wait"):
            return posted.wait()[0]

    def send_home(self, peer: int, grads: Tensor, like: Tensor) -> Posted:
        """Post ``peer``'s block's ``(2, ...)`` dk, dv to it, and a buffer (``like``) for this
        rank's from it."""
        with profiler_range("ring/grad_post"):
            return self.transport.post([(peer, grads)], [(peer, torch.empty_like(like))], self.group, kind="ring")


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, ring: _Ring) -> Tensor:  # type: ignore[override]
        me = ring.layout.rank
        kv = torch.stack([k, v])  # (2, b, h, n, d): one message per swap
        in_flight = ring.swap(0, kv)
        # Own block first: every query's log-sum-exp is then finite.
        out, lse = partial_attention(q, k, v, ring.pair(me), ring.scale, ring.mods)
        for step, peer in enumerate(ring.plan.partners):
            theirs = ring.receive(in_flight)
            in_flight = ring.swap(step + 1, kv)
            pair = ring.pair(peer)
            part_out, part_lse = partial_attention(q, theirs[0], theirs[1], pair, ring.scale, ring.mods)
            merge_partial(out, lse, part_out, part_lse)
            del theirs, part_out, part_lse
        ctx.ring = ring
        ctx.save_for_backward(q, kv, out, lse)  # kv, not k and v: backward sends it as it is
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        ring: _Ring = ctx.ring
        q, kv, out, lse = ctx.saved_tensors
        k, v = kv.unbind(0)
        grad_out = grad_out.contiguous()
        in_flight = ring.swap(0, kv)
        own = ring.pair(ring.layout.rank)
        dq, dk, dv = partial_attention_backward(grad_out, q, k, v, out, lse, own, ring.scale, ring.mods)
        grads_home: Posted | None = None
        for step, peer in enumerate(ring.plan.partners):
            theirs = ring.receive(in_flight)
            in_flight = ring.swap(step + 1, kv)
            dq_part, dk_theirs, dv_theirs = partial_attention_backward(
                grad_out, q, theirs[0], theirs[1], out, lse, ring.pair(peer), ring.scale, ring.mods
            )
            dq += dq_part
            del theirs, dq_part
            _add_home(grads_home, dk, dv)  # the previous step's, before this one's buffers exist
            outgoing = torch.stack([dk_theirs, dv_theirs])
            del dk_theirs, dv_theirs
            grads_home = ring.send_home(peer, outgoing, kv)
            del outgoing  # the posted work holds it until sent
        _add_home(grads_home, dk, dv)
        return dq, dk, dv, None


def _add_home(posted: Posted | None, dk: Tensor, dv: Tensor) -> None:
    """Wait for a partner's dk, dv of this rank's block and add them."""
    if posted is None:
        return
    with profiler_range("ring/grad_wait"):
        grads = posted.wait()[0]
    dk += grads[0]
    dv += grads[1]


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int | None,
    layout: ShardLayout,
    group: dist.ProcessGroup,
    transport: Transport | None = None,
    segment_ids: Tensor | None = None,
    mods: ScoreMods | None = None,
) -> Tensor:
    """Attention of this rank's queries over every rank's keys within ``window``, by ring passes.

    Args:
        q, k, v: this rank's ``(batch, heads, local_points, head_dim)``.
        window: ``W`` (None: global attention); positions are global (``layout``'s offsets).
        segment_ids: every point's ids ``(batch or 1, points)`` (the whole sequence, not this
            rank's block), or None.
        mods: a softcap and the ALiBi slopes of q's heads, applied at global positions.
    Returns:
        ``(batch, heads, local_points, head_dim)``.
    """
    if q.shape[2] != layout.local_size or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"ring attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} must all hold "
            f"this rank's {layout.local_size} points on dim 2"
        )
    plan = RingPlan.build(layout, window)
    scale = 1 / math.sqrt(q.shape[-1])
    ring = _Ring(layout, plan, group, transport or Transport(), window, scale, segment_ids, mods)
    return _RingAttention.apply(q, k, v, ring)
