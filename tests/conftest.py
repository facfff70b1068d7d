import os
from pathlib import Path

import pytest
import torch

# attention_path=auto and trainer.matmul=auto keep their static rules in every run a test makes
# (and in the processes they spawn): what a loaded machine times fastest must not change a
# test's numbers. The probes' own tests turn them back on.
os.environ["GRIDSHARD_ATTENTION_PROBE"] = "0"
os.environ["GRIDSHARD_MATMUL_PROBE"] = "0"
# The commands the tests start (python -m training, torchrun) import the tests' step hooks
# (debug.hooks=[tests.training.hooks.faults:FaultInjector]) from the repository, whatever their
# working directory, as a user's run from the repository's root does.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).resolve().parent.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
)

from processor.runtime import start_fork_server
from tests.rank_pool import RankPool

# Local gloo ranks fork from one server per process (processor.runtime.launch), which imports
# what the first run's rank function needs; started here with the app's, not with whatever the
# first test happens to run. With MLflow's client and sqlite store too: rank 0's tracker thread
# imports them (2.5-3 s, holding the GIL the rank's own loop needs) in every run with MLflow on.
start_fork_server("training.app", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip, saying why, where torch sees no GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _session_pools():
    """The session's pools, newest last; every one is closed at the end of the session."""
    pools: list[RankPool] = []
    yield pools
    for pool in pools:
        pool.close()


@pytest.fixture(scope="module")
def rank_pool(_session_pools):
    """Four local gloo ranks (and sub-groups of 2 and 3), shared by every module of the session
    (starting them costs seconds); a new pool when a case broke the last one."""
    if not _session_pools or not _session_pools[-1].healthy:
        _session_pools.append(RankPool(max_ranks=4, timeout=120.0))
    return _session_pools[-1]
