"""A training run's own trainer on this rank, for the benchmarks that time its steps
(``step_profile``, ``matmul_ab``): the run's set-up as ``python -m training`` makes it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from training.config.schema import RunConfig

if TYPE_CHECKING:
    from training.distributed.parallel import ParallelDims
    from training.loop.trainer import Trainer


class StepClock:
    """Trains ``trainer``'s steps one after another, timing each."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.next_step = trainer.start

    def step(self) -> float:
        """Train the next step; its seconds."""
        start = time.perf_counter()
        self.trainer.one_step(self.next_step)
        self.next_step += 1
        return time.perf_counter() - start


@contextmanager
def rank_trainer(cfg: RunConfig, warmup: int) -> Iterator[tuple[StepClock, ParallelDims]]:
    """Join the run's ranks, open this rank's session and trainer, train ``warmup`` steps, and
    hand over the clock and the ranks' dims (the heartbeat runs until the block ends)."""
    from training.distributed.ranks import join_ranks

    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat:
        clock = StepClock(new_trainer(cfg, dims))
        for _ in range(warmup):
            clock.step()
        yield clock, dims


def new_trainer(cfg: RunConfig, dims: ParallelDims) -> Trainer:
    """This rank's session and trainer of the run ``cfg``, as ``python -m training`` opens them."""
    from training.loop.trainer import Trainer
    from training.model.rollout import rollout_horizon
    from training.session import open_session

    return Trainer(open_session(cfg, dims, rollout_horizon(cfg.trainer)))
