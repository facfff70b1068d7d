import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.distributed import ShardLayout, shard_offsets, shard_sizes


def test_anemoi_order_larger_blocks_first():
    assert shard_sizes(10, 4) == [3, 3, 2, 2]
    assert shard_offsets([3, 3, 2, 2]) == [0, 3, 6, 8]


@given(n=st.integers(0, 10_000), p=st.integers(1, 64))
def test_balanced_and_complete(n, p):
    sizes = shard_sizes(n, p)
    assert sum(sizes) == n and len(sizes) == p
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_layout_ranges():
    layout = ShardLayout((3, 3, 2, 2), rank=2)
    assert (layout.start, layout.stop, layout.total, layout.local_size) == (6, 8, 10, 2)


@pytest.mark.parametrize("args", [(5, 0), (-1, 2)])
def test_bad_arguments(args):
    with pytest.raises(ValueError):
        shard_sizes(*args)


def test_bad_layout():
    with pytest.raises(ValueError, match="outside"):
        ShardLayout((1, 2), rank=2)
