"""The analytic bytes each strategy states (processor.strategies.traffic and the strategies'
cost methods), and the FLOP model."""

import pytest

from processor.distributed import shard_sizes
from processor.plan import Workload, processor_flops, window_pairs
from processor.plan import processor_bytes as strategy_bytes
from processor.strategies import resolve_strategy
from processor.strategies.traffic import halo_rows, head_all_to_all_bytes, ring_partners


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
    **options,
) -> int:
    """Bytes ``rank`` sends under the built-in ``strategy`` with ``options``, asked of the
    strategy; ``row_bytes`` (a multiple of 4) as fp32 channels of one sample."""
    assert row_bytes % 4 == 0
    work = Workload(
        points=sum(sizes),
        num_layers=num_layers,
        num_channels=row_bytes // 4,
        num_heads=num_heads,
        window_size=window_size,
        num_chunks=chunks if checkpointed else 0,
        ranks=len(sizes),
    )
    return strategy_bytes(resolve_strategy(strategy, options), work, sizes, rank)


def _halo_rows_by_counting(sizes: list[int], rank: int, width: int) -> tuple[int, int]:
    owner = [r for r, s in enumerate(sizes) for _ in range(s)]
    n = len(owner)
    mine = [i for i in range(n) if owner[i] == rank]
    received = sum(1 for i in range(n) if owner[i] != rank and min(abs(i - j) for j in mine) <= width)
    sent = 0
    for peer in range(len(sizes)):
        theirs = [i for i in range(n) if owner[i] == peer]
        if peer != rank and theirs:
            sent += sum(1 for i in mine if min(abs(i - j) for j in theirs) <= width)
    return sent, received


@pytest.mark.parametrize("sizes", [[10, 10, 10], [7, 3, 1, 9], [2, 2, 2, 2], [12, 5]])
@pytest.mark.parametrize("width", [1, 3, 8, 40])
def test_halo_rows_match_counting_rows_within_the_window(sizes, width):
    for rank in range(len(sizes)):
        assert halo_rows(sizes, rank, width) == _halo_rows_by_counting(sizes, rank, width)


def test_shard_heads_even_split_is_the_textbook_formula():
    n, c, p = 40320, 128, 4
    sizes = shard_sizes(n, p)
    per_layer = head_all_to_all_bytes(sizes, 1, num_heads=8, row_bytes=c * 4)
    one_way = 4 * (n // p) * c * (p - 1) / p * 4
    assert per_layer == 2 * one_way


def test_checkpointing_repeats_the_forward_exchange():
    sizes = shard_sizes(1000, 2)
    plain = processor_bytes("shard_sequence", sizes, 0, num_layers=3, num_heads=4, window_size=50, row_bytes=64)
    again = processor_bytes(
        "shard_sequence", sizes, 0, num_layers=3, num_heads=4, window_size=50, row_bytes=64, checkpointed=True
    )
    assert plain == 3 * (50 + 50) * 64
    assert again == 3 * (2 * 50 + 50) * 64


def test_ring_sends_each_block_to_its_partners_and_gradients_home():
    sizes = [10, 20, 10]  # window 15: rank 0 (last point 9) meets rank 1, not rank 2 (first point 30)
    kw = dict(num_layers=1, num_heads=4, window_size=15, row_bytes=4)  # 4 bytes per row
    # The window reaches no block two ranks away: the halo unless the ring is forced.
    assert processor_bytes("shard_sequence", sizes, 0, **kw) == 4 * sum(halo_rows(sizes, 0, 15))
    forced = processor_bytes("shard_sequence", sizes, 0, **kw, ring=True)
    assert forced == 4 * (2 * 2 * 10 + 2 * 20)  # my k, v to rank 1 in forward and backward; its dk, dv home
    assert ring_partners(sizes, 1, 15) == [0, 2] and ring_partners(sizes, 0, 21) == [1, 2]
    global_attention = processor_bytes("shard_sequence", sizes, 1, **{**kw, "window_size": None})
    assert global_attention == 4 * (2 * 2 * 2 * 20 + 2 * (10 + 10))  # two partners, chosen by itself


def test_hybrid_is_heads_within_groups_and_k_v_across_them():
    sizes, kw = [10, 11, 9, 12], dict(num_layers=1, num_heads=4, row_bytes=8)
    for rank in range(4):  # G = P: shard_heads; G = 1: the sequence exchange, with k and v (2 C) per row
        heads = processor_bytes("shard_heads", sizes, rank, window_size=5, **kw)
        assert processor_bytes("shard_hybrid", sizes, rank, window_size=5, head_group_size=4, **kw) == heads
        halo = processor_bytes("shard_sequence", sizes, rank, window_size=5, **kw)
        assert processor_bytes("shard_hybrid", sizes, rank, window_size=5, head_group_size=1, **kw) == 2 * halo
        ring = processor_bytes("shard_sequence", sizes, rank, window_size=None, **kw)
        assert processor_bytes("shard_hybrid", sizes, rank, window_size=None, head_group_size=1, **kw) == ring
    # 2 x 2, rank 1: the all-to-all with rank 0 over 21 points, then a halo of 5 rows of its
    # 2 heads' k and v (half a row each) with super-block [21, 42) and their gradients back.
    within = head_all_to_all_bytes([10, 11], 1, 4, 8)
    assert processor_bytes("shard_hybrid", [10, 11, 9, 12], 1, window_size=5, head_group_size=2, **kw) == (
        within + (5 + 5) * 2 * 4
    )


def test_o96_sequence_sends_over_20x_less_than_heads_analytically():
    for p in (2, 4):
        sizes = shard_sizes(40320, p)
        kw = dict(num_layers=1, num_heads=8, window_size=512, row_bytes=4)
        for rank in range(p):
            assert processor_bytes("shard_heads", sizes, rank, **kw) >= 20 * processor_bytes(
                "shard_sequence", sizes, rank, **kw
            )


@pytest.mark.parametrize("n,w", [(1, 0), (5, 0), (5, 2), (9, 3), (9, 8), (9, 20), (9, None)])
def test_window_pairs_counts_pairs_inside_the_band(n, w):
    brute = sum(1 for i in range(n) for j in range(n) if w is None or abs(i - j) <= w)
    assert window_pairs(n, w) == brute


def test_flop_model_is_the_band_model():
    n, c, w = 40320, 256, 512
    expected = 3 * 2 * (24 * n * c * c + 4 * c * window_pairs(n, w))
    assert processor_flops(n, c, w, num_layers=2, mlp_hidden_ratio=4) == expected
