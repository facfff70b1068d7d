"""A training run's own trainer on this rank, for the benchmarks that time its steps
(``step_profile``, ``matmul_ab``, ``step_toggle``): the run's set-up as ``python -m training``
makes it, launched on the run's ranks in a run directory of its own (:func:`on_run_ranks`)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_module

import training.config.schema  # noqa: F401 - registers the schema
from training.config.schema import RunConfig
from training.launch import launcher
from training.launch.command import TRAIN

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


def on_run_ranks(overrides: list[str], body: Callable[[RunConfig], Any], name: str) -> Any:
    """``body`` on each rank of ``python -m training <overrides>`` (MLflow off), in a temporary
    run directory (prefix ``gridshard-<name>-``) removed after; rank 0's result."""
    with tempfile.TemporaryDirectory(prefix=f"gridshard-{name}-") as run_dir:
        with initialize_config_module(config_module="configs", version_base="1.3"):
            composed = compose("config", [f"run_dir={run_dir}", "logging.mlflow=false", *overrides])
        return launcher.run(composed, TRAIN, body)
