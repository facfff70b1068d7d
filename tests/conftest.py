import pytest

from tests.rank_pool import RankPool


@pytest.fixture(scope="module")
def rank_pool():
    """Four local gloo ranks (and sub-groups of 2 and 3), shared by one test module."""
    pool = RankPool(max_ranks=4, timeout=120.0)
    yield pool
    pool.close()
