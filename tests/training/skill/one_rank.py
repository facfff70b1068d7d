"""A session on one rank for the skill tests: every point on it, as the field maps need."""

from __future__ import annotations

from pathlib import Path

from tests.training.conftest import small_config
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.session import Session, open_session

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def one_rank_session(run_dir: Path, dataset: Path, *overrides: str) -> Session:
    """The session of :func:`~tests.training.conftest.small_config` with ``overrides`` on one rank."""
    return open_session(prepare(small_config(run_dir, dataset, *ONE_RANK, *overrides)), ParallelDims.build(1))
