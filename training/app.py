"""``python -m training``: a Hydra app that trains the forecaster on local or torchrun ranks.

python -m training                                   # defaults: the ranks derived (one for its grid), shard_sequence
python -m training trainer.nprocs=2 strategy=shard_heads trainer.steps=100
python -m training strategy=none trainer.nprocs=1 trainer.ranks_per_model=1
torchrun --nproc-per-node 4 -m training trainer.ranks_per_model=2    # 2 replicas x 2 ranks
python -m training --multirun trainer.nprocs=2 strategy=shard_heads,shard_sequence

Launching, the run directory and errors: :mod:`training.launch.launcher`, which every command
shares; one rank's loop: :mod:`training.loop.trainer`. Only rank 0 logs the ``finished`` line.

Resuming: a command in a run directory that holds a run continues it with that run's settings,
changed only by what the command line gives (:mod:`training.launch.run_settings`). How a run ends, and
the command that continues a stopped one: :mod:`training.launch.run_end`; Ctrl-C and SIGTERM:
:mod:`training.launch.interrupt`.

Errors, exit codes and ``HYDRA_FULL_ERROR``: :mod:`training.launch.launcher`, as for every command.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from processor.runtime.torchrun import torchrun_rank
from training.config.schema import RunConfig
from training.launch import launcher
from training.launch.cli_check import discard_refused_run_dir
from training.launch.command import TRAIN
from training.launch.run_end import RunFinished, report_end
from training.launch.run_settings import command_line_keys
from training.loop.trainer import train
from training.reporting.report import log_skill

log = logging.getLogger(__name__)


def train_on_rank(resolved: RunConfig) -> dict[str, Any]:
    """One rank's training run (:func:`training.loop.trainer.train`)."""
    return train(resolved)


def run(cfg: DictConfig | RunConfig, given: list[str] | None = None) -> dict[str, Any]:
    """Train ``cfg`` (Hydra's composition, or a resolved configuration) on its ranks; rank 0's
    result. ``given``: the keys the command line set (:func:`training.launch.launcher.prepare`)."""
    return launcher.run(cfg, TRAIN, train_on_rank, given)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> float:
    given = command_line_keys()
    try:
        result = launcher.run_reporting_errors(lambda c: run(c, given=given), cfg)
    except RunFinished as finished:
        if torchrun_rank() == 0:
            log.info("%s", finished)
        return float("nan")
    except KeyboardInterrupt:  # before the ranks started (preparing, writing the dataset)
        discard_refused_run_dir(cfg.run_dir)
        print("error: interrupted before training started (no step trained)", file=sys.stderr)
        sys.exit(130)
    if torchrun_rank() == 0:
        log_skill(result.get("skill"), cfg.run_dir, cfg.logging.plots)
    return report_end(result, cfg.run_dir)
