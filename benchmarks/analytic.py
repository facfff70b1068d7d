"""What each strategy should send, from the shard sizes alone (independent of the code that sends).

All counts are bytes sent by one rank to *other* ranks in one forward+backward, for one
processor layer, with ``batch`` samples of ``channels`` values of ``element_size`` bytes:

- ``shard_heads``: the packed q, k, v all-to-all sends my points' q, k, v of every other
  rank's heads, ``3 n_r (C - c_r)``; the output all-to-all sends my heads' output for every
  other rank's points, ``(N - n_r) c_r``. Backward sends what forward received:
  ``3 (N - n_r) c_r + n_r (C - c_r)``. In total ``4 n_r (C - c_r) + 4 (N - n_r) c_r`` values,
  with ``c_r`` the channels of rank r's heads (``4 (N/P) C (P-1)/P`` each way when even).
- ``shard_sequence``: forward sends every row of mine that lies within W of another rank's
  block (W rows to each neighbour when shards are at least W long); backward returns the
  gradient of every halo row received, ``min(W, start) + min(W, N - stop)`` rows. C values per
  row (the normed layer input is exchanged, not k and v). When a window reaches past a
  neighbour's block (global attention among them) the ring runs instead: forward sends my k
  and v (2C per row, ``2 n_r`` rows' worth) to every rank whose block my window meets;
  backward sends them again, and each partner's dk, dv of its block home, ``2 n_p`` each.
- ``shard_channels``: per layer two all-gathers of the normed points (before ``qkv`` and the
  MLP's first layer) and two reduce-scatters of partial sums (after the output projection and
  the MLP's second layer), each sending ``(P - 1) max_r n_r`` rows per rank (gloo gathers
  equal chunks: shorter blocks are padded to the longest). Backward: each one's transpose,
  the same again. Under activation checkpointing the recomputation stops early (torch's default) once every
  saved tensor is back, so the last reduce-scatter of each checkpointed chunk, whose output
  nothing saves, is not repeated.
- ``shard_hybrid`` with head groups of ``G`` ranks: ``shard_heads``' all-to-all among the
  ``G`` ranks of my head group (over its points), then ``shard_sequence``'s exchange among
  the ``P / G`` super-blocks for my heads' k and v: a halo of ``2 c_r`` values per row (k and
  v, not the normed input: the heads are split), or the ring's blocks of ``c_r`` per row.

With activation checkpointing the forward exchange runs again when backward recomputes it.
Under bf16 autocast every payload is bf16 (:func:`exchanged_element_size`): the normed rows that
travel (the halo, the all-gathers) are rounded to the compute dtype before they are sent.
"""

from __future__ import annotations

from processor.distributed.hybrid_groups import super_blocks
from processor.distributed.ring import reaches_beyond_neighbours
from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes
from processor.strategies.shard_hybrid import ShardHybrid


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


def sequence_uses_ring(sizes: list[int], width: int | None, ring: bool | None = None) -> bool:
    """Whether ``shard_sequence`` runs this split and window by ring passes: its ``ring``
    option, or when None its own choice."""
    if ring is not None:
        return ring and len(sizes) > 1
    return len(sizes) > 1 and reaches_beyond_neighbours(ShardLayout(tuple(sizes), 0), width)


def shard_heads_bytes(sizes: list[int], rank: int, num_heads: int, row_bytes: int, forward_passes: int = 1) -> int:
    """Bytes one rank sends for one ``shard_heads`` layer; ``row_bytes`` is one point's C values."""
    n, mine = sum(sizes), sizes[rank]
    heads = shard_sizes(num_heads, len(sizes))
    share = heads[rank] / num_heads  # fraction of the channels that are my heads'
    forward = 3 * mine * (1 - share) + (n - mine) * share
    backward = 3 * (n - mine) * share + mine * (1 - share)
    return round((forward_passes * forward + backward) * row_bytes)


def hybrid_group_size(num_heads: int, ranks: int, head_group_size: int | None = None) -> int:
    """``shard_hybrid``'s ``G``: the option, or its default for ``num_heads`` on ``ranks``."""
    return ShardHybrid(head_group_size=head_group_size).group_size(num_heads, ranks)


def shard_hybrid_bytes(
    sizes: list[int],
    rank: int,
    num_heads: int,
    window: int | None,
    row_bytes: int,
    forward_passes: int = 1,
    *,
    head_group_size: int | None = None,
    ring: bool | None = None,
) -> int:
    """Bytes one rank sends for one ``shard_hybrid`` layer (``row_bytes``: one point's C values)."""
    g = hybrid_group_size(num_heads, len(sizes), head_group_size)
    sequence_index, head_index = divmod(rank, g)
    members = sizes[sequence_index * g : (sequence_index + 1) * g]
    total = shard_heads_bytes(members, head_index, num_heads, row_bytes, forward_passes) if g > 1 else 0
    supers = super_blocks(sizes, g)
    mine = row_bytes * shard_sizes(num_heads, g)[head_index] // num_heads  # my heads' share of a row
    if len(supers) == 1:
        return total
    if sequence_uses_ring(supers, window, ring):
        return total + ring_bytes(supers, sequence_index, window, mine, forward_passes)
    return total + halo_bytes(supers, sequence_index, window, 2 * mine, forward_passes)


def shard_channels_bytes(sizes: list[int], row_bytes: int, forward_passes: int = 1) -> int:
    """Bytes one rank sends for one ``shard_channels`` layer: two all-gathers and two
    reduce-scatters of ``row_bytes`` rows, forward and backward."""
    rows = (len(sizes) - 1) * max(sizes)
    return (forward_passes + 1) * 4 * rows * row_bytes


def processor_bytes(
    strategy: str,
    sizes: list[int],
    rank: int,
    *,
    num_layers: int,
    num_heads: int,
    window_size: int | None,
    row_bytes: int,
    checkpointed: bool = False,
    chunks: int = 1,
    ring: bool | None = None,
    head_group_size: int | None = None,
) -> int:
    """Bytes one rank sends in one forward+backward of the whole processor (``ring``,
    ``head_group_size``: the strategy's options)."""
    if strategy == "none" or len(sizes) == 1:
        return 0
    passes = 2 if checkpointed else 1
    if strategy == "shard_heads":
        per_layer = shard_heads_bytes(sizes, rank, num_heads, row_bytes, passes)
    elif strategy == "shard_sequence" and sequence_uses_ring(sizes, window_size, ring):
        per_layer = ring_bytes(sizes, rank, window_size, row_bytes, passes)
    elif strategy == "shard_sequence":
        per_layer = halo_bytes(sizes, rank, window_size, row_bytes, passes)
    elif strategy == "shard_hybrid":
        per_layer = shard_hybrid_bytes(
            sizes, rank, num_heads, window_size, row_bytes, passes, head_group_size=head_group_size, ring=ring
        )
    elif strategy == "shard_channels":
        per_layer = shard_channels_bytes(sizes, row_bytes, passes)
        if checkpointed:  # each chunk's recomputation skips its last reduce-scatter
            skipped = chunks * (len(sizes) - 1) * max(sizes) * row_bytes
            return num_layers * per_layer - skipped
    else:
        raise ValueError(f"no communication model for strategy {strategy!r}")
    return num_layers * per_layer


def segment_id_bytes(
    strategy: str, sizes: list[int], rank: int, window_size: int | None, ring: bool | None = None
) -> int:
    """Bytes one rank sends to share the segment ids (int64, one row per point) once per
    forward: ``shard_sequence`` a halo of them (unless it runs the ring), the others an
    all-gather (padded like ``shard_channels``' rows). Integer ids have no gradient: no backward."""
    if len(sizes) == 1 or strategy == "none":
        return 0
    if strategy == "shard_sequence" and not sequence_uses_ring(sizes, window_size, ring):
        return halo_rows(sizes, rank, window_size)[0] * 8
    return (len(sizes) - 1) * max(sizes) * 8


def exchanged_element_size(precision: str) -> int:
    """Bytes per exchanged value: 2 under bf16 autocast, where every strategy sends in the
    compute dtype (:mod:`processor.precision`), else 4."""
    return 2 if precision == "bf16" else 4
