import os

import pytest
import torch

# attention_path=auto keeps its static rule in every run a test makes (and in the processes they
# spawn): which path a loaded machine times fastest must not change a test's numbers. The
# probe's own tests turn it back on.
os.environ["GRIDSHARD_ATTENTION_PROBE"] = "0"

from tests.rank_pool import RankPool


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip, saying why, where torch sees no GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def rank_pool():
    """Four local gloo ranks (and sub-groups of 2 and 3), shared by one test module."""
    pool = RankPool(max_ranks=4, timeout=120.0)
    yield pool
    pool.close()
