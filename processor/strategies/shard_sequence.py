"""``shard_sequence``: keep the local points, borrow a halo of W rows from the neighbours, or
pass key blocks around a ring when the window reaches farther.

Per layer the normed input ``h`` of the halo rows (W from each side, gathered across several
ranks if a neighbour's shard is shorter than W) is exchanged, not k and v: C values per row
instead of 2C, at the price of projecting 2W extra rows of k and v. Under autocast they travel
in the compute dtype (:mod:`processor.precision`), the dtype the projection would round them to.
Queries are projected for the local rows only, so no attention is computed for halo rows.

The exchange is overlapped with attention: it is posted first, then the *interior* queries,
whose window holds local rows only, attend while it travels; the *edge* queries (W rows at
each end with a neighbour) attend once the halo is in. Backward runs the same overlap in
reverse (see :class:`processor.distributed.halo.HaloExchange`).

When some rank's window reaches past its neighbours (global attention, or W wider than a
neighbour's shard), the halo would gather most of the sequence onto every rank. Then the
keys and values travel instead, a block at a time, only to the ranks whose window reaches
them (:func:`processor.distributed.ring.ring_attention`): memory per rank stays ``O(N / P)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from processor.distributed.halo import HaloConfig, HaloExchange, halo_pad, start_halo_exchange
from processor.distributed.ranges import profiler_range
from processor.distributed.ring import reaches_beyond_neighbours, ring_attention
from processor.distributed.shards import ShardLayout
from processor.precision import in_compute_dtype
from processor.strategies.base import HeadAttention, PointSharded, ShardContext, StrategyOptionError
from processor.strategies.cost import CommPart, Workload
from processor.strategies.traffic import halo_bytes, halo_rows, ring_bytes, sequence_messages, uses_ring


@dataclass(frozen=True)
class ShardSequence(PointSharded):
    """Any window works on any number of ranks.

    Args:
        ring: pass key blocks around a ring (True), gather a halo from as many ranks as it
            spans (False), or choose by the window's reach (None: the ring when a window
            reaches past a neighbour, the halo otherwise). The halo supports attention
            dropout, the ring does not.
    """

    ring: bool | None = None
    name = "shard_sequence"

    def __post_init__(self) -> None:
        if self.ring is not None and not isinstance(self.ring, bool):
            raise StrategyOptionError("ring", f"{self.ring!r} is out of range: expected true, false or null (auto)")

    def uses_ring(self, layout: ShardLayout, window: int | None) -> bool:
        """Whether this split and window run by ring passes (the same answer on every rank)."""
        return reaches_beyond_neighbours(layout, window) if self.ring is None else self.ring

    def share_segment_ids(self, segment_ids: Tensor, ctx: ShardContext) -> Tensor:
        """The ids of the keys the attention calls see: the halo-padded ones,
        ``(batch or 1, left + local_points + right)``, travelling with the halo once per forward
        (not per layer); with the ring, every point's."""
        if self.uses_ring(ctx.layout, ctx.window_size):
            return super().share_segment_ids(segment_ids, ctx)
        config = HaloConfig(width=ctx.window_size, dim=1)
        return halo_pad(segment_ids, config, ctx.layout, ctx.group, ctx.transport)

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        if self.uses_ring(ctx.layout, attn.window_size):
            return self._ring(attn, h, ctx)
        return self._halo(attn, h, ctx)

    def _ring(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        if attn.dropout_p > 0 and attn.training:
            raise ValueError(
                "shard_sequence: attention dropout (dropout_p > 0) does not run through ring passes; "
                "set dropout_p=0, or ShardSequence(ring=False) to gather the halo instead"
            )
        start = ctx.layout.start
        q, (k, v) = attn.queries(h, start), attn.keys_values(h, start)
        ids, mods = ctx.key_segment_ids, attn.score_mods(device=q.device)
        out = ring_attention(q, k, v, attn.window_size, ctx.layout, ctx.group, ctx.transport, ids, mods)
        return attn.merge_heads([out])

    def _halo(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        # The halo rows only enter k and v's projection: send them in its compute dtype.
        exchange = start_halo_exchange(
            in_compute_dtype(h), HaloConfig(width=attn.window_size, dim=1), ctx.layout, ctx.group, ctx.transport
        )
        q, (k, v) = attn.queries(h, ctx.layout.start), attn.keys_values(h, ctx.layout.start)
        parts = halo_attention(attn, q, k, v, exchange, attn.keys_values, ctx.layout, ctx.key_segment_ids)
        return attn.merge_heads(parts)

    # Its cost: the normed input's halo (C values per row), or k and v around the ring.

    def layer_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        window, passes = work.window_size, work.forward_passes
        if uses_ring(sizes, window, self.ring):
            return ring_bytes(sizes, rank, window, work.attention_row_bytes, passes)  # k and v: A values each
        return halo_bytes(sizes, rank, window, work.row_bytes, passes)  # the normed input: C values

    def segment_id_bytes(self, work: Workload, sizes: list[int], rank: int) -> int:
        if uses_ring(sizes, work.window_size, self.ring):
            return super().segment_id_bytes(work, sizes, rank)
        return halo_rows(sizes, rank, work.window_size)[0] * 8  # the halo's ids, once per forward

    def comm_parts(self, work: Workload, sizes: list[int], sent: int) -> list[CommPart]:
        messages = sequence_messages(sizes, work.window_size, work.forward_passes, self.ring)
        return [CommPart(sent, work.num_layers * messages, work.ranks, overlapped=True)]

    def extra_projection_flops(self, work: Workload, sizes: list[int]) -> int:
        if uses_ring(sizes, work.window_size, self.ring):
            return 0
        n, c, a = work.points, work.num_channels, work.attention_channels
        return 2 * 2 * min(work.window_size or n, n) * 2 * c * a  # k, v of the 2W halo rows

    def kept_values_per_layer(self, work: Workload) -> int:
        """k and v of the 2W halo rows (none through the ring, which keeps nothing remote)."""
        n = work.points
        if uses_ring(work.sizes, work.window_size, self.ring):
            return 0
        return 2 * min(work.window_size or n, n) * 2 * work.attention_channels


def halo_attention(
    attn: HeadAttention,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    exchange: HaloExchange,
    halo_keys_values: Callable[[Tensor, int], tuple[Tensor, Tensor]],
    layout: ShardLayout,
    ids: Tensor | None,
    first_head: int | None = None,
) -> list[Tensor]:
    """This rank's windowed attention while its halo travels: the queries whose window holds
    local rows only attend first, those at the edges once ``exchange`` is in.

    Args:
        q, k, v: the local rows' ``(batch, heads, local_points, head_dim)``.
        exchange: the halo exchange already posted (of whatever rows the keys come from).
        halo_keys_values: a received halo piece and the global index of its first point -> its
            k and v, ``(batch, heads, rows, head_dim)``.
        ids: segment ids aligned with the halo-padded keys ``(batch or 1, left + n + right)``, or None.
        first_head: the layer's index of q's first head (default: the layer's own).
    Returns:
        Outputs of consecutive query ranges, each ``(batch, heads, n_i, head_dim)``.
    """
    window = attn.window_size
    left, right = exchange.plan.left, exchange.plan.right
    n = q.shape[2]
    reach = layout.total if window is None else window
    # Local queries [first, stop) see local keys only; those before and after need the halo.
    first = min(reach, n) if left else 0
    stop = max(n - reach, first) if right else n

    def attend(queries: Tensor, keys: Tensor, values: Tensor, q_offset: int, key_lo: int) -> Tensor:
        # keys are padded rows [key_lo, key_lo + keys.shape[2]); their ids travel alongside
        seg = None if ids is None else ids[:, key_lo : key_lo + keys.shape[2]]
        return attn.attend(queries, keys, values, q_offset=q_offset, segment_ids=seg, first_head=first_head)

    with profiler_range("halo_attention/interior"):  # while the halo travels
        interior = attend(q[:, :, first:stop], k, v, first, left) if stop > first else None

    halo_left, halo_right = exchange.finish()
    k_left, v_left = halo_keys_values(halo_left, layout.start - left)
    k_right, v_right = halo_keys_values(halo_right, layout.stop)
    # Keys in padded order: the left halo, the local rows, the right halo.
    keys, values = (k_left, k, k_right), (v_left, v, v_right)
    parts = []
    with profiler_range("halo_attention/edges"):
        if first > 0:  # queries [0, first) at padded rows [left, left + first)
            hi = min(left + first + reach, left + n + right)
            parts.append(attend(q[:, :, :first], _span(keys, 0, hi), _span(values, 0, hi), left, 0))
        if interior is not None:
            parts.append(interior)
        if stop < n:  # queries [stop, n) at padded rows [left + stop, left + n)
            lo = max(left + stop - reach, 0)
            hi = left + n + right
            parts.append(attend(q[:, :, stop:], _span(keys, lo, hi), _span(values, lo, hi), left + stop - lo, lo))
    return parts


def _span(pieces: tuple[Tensor, ...], lo: int, hi: int) -> Tensor:
    """Rows ``[lo, hi)`` of the concatenation of ``pieces`` along dim 2, copying only those rows."""
    out, offset = [], 0
    for piece in pieces:
        rows = piece.shape[2]
        a, b = max(lo - offset, 0), min(hi - offset, rows)
        if a < b:
            out.append(piece[:, :, a:b])
        offset += rows
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)
