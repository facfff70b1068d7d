"""What the communication patterns send, from the shard sizes alone (independent of the code
that sends): the formulas the strategies state their bytes with.

All counts are bytes sent by one rank to *other* ranks in one forward+backward of one layer;
``row_bytes`` is one point's values on the wire (``batch * channels * element size``):

- A **halo** of ``width`` rows per side (``shard_sequence``): forward sends every row of mine
  that lies within ``width`` of another rank's block (``width`` rows to each neighbour when
  shards are at least that long); backward returns the gradient of every halo row received,
  ``min(W, start) + min(W, N - stop)`` rows.
- **Ring passes** (a window reaching past the neighbours): forward sends my k and v (two rows'
  worth per point) to every rank whose block my window meets; backward sends them again, and
  each partner's dk, dv of its block home.
- The **head all-to-all** (``shard_heads``): the packed q, k, v trade sends my points' q, k, v
  of every other rank's heads, ``3 n_r (C - c_r)``; the output trade sends my heads' output for
  every other rank's points, ``(N - n_r) c_r``. Backward sends what forward received.
- **Gathers and reduce-scatters of points** (``shard_channels``, segment ids): ``(P - 1) max_r
  n_r`` rows per rank (gloo gathers equal chunks: shorter blocks are padded to the longest).

With activation checkpointing a forward exchange runs again when backward recomputes it
(``forward_passes = 2``). Under bf16 autocast every payload is bf16
(:func:`exchanged_element_size`).
"""

from __future__ import annotations

from processor.distributed.ring import reaches_beyond_neighbours
from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes


def halo_rows(sizes: list[int], rank: int, width: int | None) -> tuple[int, int]:
    """``(sent, received)`` rows of one forward halo exchange of ``width`` rows per side."""
    n = sum(sizes)
    w = n if width is None else width
    starts = shard_offsets(sizes)
    mine = (starts[rank], starts[rank] + sizes[rank])
    received = min(w, mine[0]) + min(w, n - mine[1])
    sent = 0
    for peer, (start, size) in enumerate(zip(starts, sizes)):
        if peer == rank:
            continue
        for lo, hi in ((max(0, start - w), start), (start + size, min(n, start + size + w))):
            sent += max(0, min(hi, mine[1]) - max(lo, mine[0]))
    return sent, received


def halo_bytes(sizes: list[int], rank: int, width: int | None, row_bytes: int, forward_passes: int = 1) -> int:
    """Bytes one rank sends for a halo-padded tensor in forward (``forward_passes`` times) and backward."""
    sent, received = halo_rows(sizes, rank, width)
    return (forward_passes * sent + received) * row_bytes


def ring_partners(sizes: list[int], rank: int, width: int | None) -> list[int]:
    """The ranks whose block holds a point within ``width`` of one of mine (None: every
    non-empty block), other than mine."""
    starts = shard_offsets(sizes)
    if sizes[rank] == 0:
        return []
    lo, hi = starts[rank], starts[rank] + sizes[rank] - 1  # my first and last point
    w = sum(sizes) if width is None else width
    return [
        p
        for p, (start, size) in enumerate(zip(starts, sizes))
        if p != rank and size > 0 and start - hi <= w and lo - (start + size - 1) <= w
    ]


def ring_bytes(sizes: list[int], rank: int, width: int | None, row_bytes: int, forward_passes: int = 1) -> int:
    """Bytes one rank sends for one layer's ring passes (``row_bytes``: one point's C values)."""
    partners = ring_partners(sizes, rank, width)
    blocks_out = (forward_passes + 1) * len(partners) * 2 * sizes[rank]  # my k and v, forward and backward
    grads_home = sum(2 * sizes[p] for p in partners)  # dk, dv of each partner's block
    return (blocks_out + grads_home) * row_bytes


def uses_ring(sizes: list[int], width: int | None, ring: bool | None = None) -> bool:
    """Whether a sequence split runs by ring passes: the ``ring`` option, or when None whether
    some rank's window reaches past its neighbours."""
    if ring is not None:
        return ring and len(sizes) > 1
    return len(sizes) > 1 and reaches_beyond_neighbours(ShardLayout(tuple(sizes), 0), width)


def sequence_messages(sizes: list[int], width: int | None, forward_passes: int, ring: bool | None = None) -> int:
    """Messages per layer of the busiest rank: the halo's (to both neighbours, forward and
    backward) or the ring's."""
    if len(sizes) == 1:
        return 0
    if uses_ring(sizes, width, ring):
        return (forward_passes + 2) * max(len(ring_partners(sizes, r, width)) for r in range(len(sizes)))
    return (forward_passes + 1) * 2


def head_all_to_all_bytes(sizes: list[int], rank: int, num_heads: int, row_bytes: int, forward_passes: int = 1) -> int:
    """Bytes one rank sends for one layer's two head all-to-alls (q, k, v out, the output back)."""
    n, mine = sum(sizes), sizes[rank]
    heads = shard_sizes(num_heads, len(sizes))
    share = heads[rank] / num_heads  # fraction of the channels that are my heads'
    forward = 3 * mine * (1 - share) + (n - mine) * share
    backward = 3 * (n - mine) * share + mine * (1 - share)
    return round((forward_passes * forward + backward) * row_bytes)


def gathered_rows(sizes: list[int]) -> int:
    """Rows one rank sends in one all-gather or reduce-scatter of the points (padded chunks)."""
    return (len(sizes) - 1) * max(sizes)


def exchanged_element_size(precision: str) -> int:
    """Bytes per exchanged value: 2 under bf16 autocast, where every strategy sends in the
    compute dtype (:mod:`processor.precision`), else 4."""
    return 2 if precision == "bf16" else 4
