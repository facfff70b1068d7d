"""``shard_sequence``: keep the local points, borrow a halo of W rows from the neighbours.

Per layer the normed input ``h`` of the halo rows (W from each side, gathered across several
ranks if a neighbour's shard is shorter than W) is exchanged, not k and v: C values per row
instead of 2C, at the price of projecting 2W extra rows of k and v. Queries are projected for
the local rows only, so no attention is computed for halo rows.

The exchange is overlapped with attention: it is posted first, then the *interior* queries,
whose window holds local rows only, attend while it travels; the *edge* queries (W rows at
each end with a neighbour) attend once the halo is in. Backward runs the same overlap in
reverse (see :class:`processor.distributed.halo.HaloExchange`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from processor.distributed.halo import HaloConfig, halo_pad, start_halo_exchange
from processor.strategies.base import HeadAttention, PointSharded, ShardContext


class ShardSequence(PointSharded):
    """Any window works on any number of ranks: a halo wider than a neighbour's shard is
    gathered from as many ranks as it spans."""

    name = "shard_sequence"

    def share_segment_ids(self, segment_ids: Tensor, ctx: ShardContext) -> Tensor:
        """The ids of the halo-padded keys, ``(batch or 1, left + local_points + right)``: the ids
        travel with the halo once per forward, not per layer."""
        config = HaloConfig(width=ctx.window_size, dim=1)
        return halo_pad(segment_ids, config, ctx.layout, ctx.group, ctx.transport)

    def attend(self, attn: HeadAttention, h: Tensor, ctx: ShardContext) -> Tensor:
        window = attn.window_size
        exchange = start_halo_exchange(h, HaloConfig(width=window, dim=1), ctx.layout, ctx.group, ctx.transport)
        left, right = exchange.plan.left, exchange.plan.right
        n = h.shape[1]
        reach = ctx.layout.total if window is None else window
        # Local queries [first, stop) see local keys only; those before and after need the halo.
        first = min(reach, n) if left else 0
        stop = max(n - reach, first) if right else n
        q = attn.queries(h)
        k, v = attn.keys_values(h)
        ids = ctx.key_segment_ids  # (b or 1, left + n + right) or None

        def attend(queries: Tensor, keys: Tensor, values: Tensor, q_offset: int, key_lo: int) -> Tensor:
            # keys are padded rows [key_lo, key_lo + keys.shape[2]); their ids travel alongside
            seg = None if ids is None else ids[:, key_lo : key_lo + keys.shape[2]]
            return attn.attend(queries, keys, values, q_offset=q_offset, segment_ids=seg)

        interior = attend(q[:, :, first:stop], k, v, first, left) if stop > first else None

        halo_left, halo_right = exchange.finish()
        k_left, v_left = attn.keys_values(halo_left)
        k_right, v_right = attn.keys_values(halo_right)
        # Keys in padded order: the left halo, the local rows, the right halo.
        keys, values = (k_left, k, k_right), (v_left, v, v_right)
        parts = []
        if first > 0:  # queries [0, first) at padded rows [left, left + first)
            hi = min(left + first + reach, left + n + right)
            parts.append(attend(q[:, :, :first], _span(keys, 0, hi), _span(values, 0, hi), left, 0))
        if interior is not None:
            parts.append(interior)
        if stop < n:  # queries [stop, n) at padded rows [left + stop, left + n)
            lo = max(left + stop - reach, 0)
            hi = left + n + right
            parts.append(attend(q[:, :, stop:], _span(keys, lo, hi), _span(values, lo, hi), left + stop - lo, lo))
        return attn.merge_heads(parts)


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
