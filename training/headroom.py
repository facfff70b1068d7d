"""``python -m training.headroom``: what a store holds at the first lead, before a model is trained.

python -m training.headroom data=zarr data.path=/path/to/store.zarr
python -m training.headroom data=zarr data.path=S evaluate.steps=5    # the dates a 5-lead table scores

Opens the store as a training run would (the settings derived from it, the same training and
validation dates) and scores, at the first lead on the validation samples the skill table scores,
persistence and the per-point ``linear_regression`` beside two forecasts that see every point's
inputs at once: a ridge regression and a Gaussian-kernel ridge regression
(:mod:`training.skill.headroom`). Writes ``headroom.md`` in its run directory and prints it; logs
the scores to MLflow as an evaluation would (``eval/rmse/<variable>/<kind>/<lead>``, tagged
``kind: headroom``).
A trained model well past ``field_ridge`` has learnt more than a linear forecast of the whole
field; a model level with it has learnt what the inputs hold linearly.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from processor.runtime.torchrun import under_torchrun
from training.config.checks import AUTO
from training.config.schema import RunConfig
from training.config.settings import ConfigValueError
from training.distributed.ranks import join_ranks
from training.launch import launcher
from training.launch.command import Command
from training.launch.launcher import run_reporting_errors
from training.model.linear_baseline import PERSISTENCE
from training.reporting.report import open_tracker
from training.session import open_session
from training.skill.headroom import headroom_markdown, headroom_table

log = logging.getLogger(__name__)


def one_untrained_rank(cfg: RunConfig) -> None:
    """Every point on one rank: the field forecasts read the whole grid at once. No model is
    trained, so the model's own regression (``model.baseline``) is not fitted unless asked."""
    if cfg.model.baseline == AUTO:
        cfg.model.baseline = PERSISTENCE
    if cfg.model.field_input is None:
        cfg.model.field_input = False  # the model's field forecast: not used here, not fitted
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        raise ConfigValueError("python -m training.headroom runs on one rank: start it without torchrun")
    trainer = cfg.trainer
    for key in ("nprocs", "ranks_per_model"):
        value = getattr(trainer, key)
        if value is not None and value != 1:
            raise ConfigValueError(
                f"trainer.{key} = {value}: python -m training.headroom runs on one rank; leave it unset or set 1"
            )
        setattr(trainer, key, 1)


def headroom_on_rank(cfg: RunConfig) -> str:
    """Score the store's first lead (see the module); write and return ``headroom.md``'s text."""
    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat:
        session = open_session(cfg, dims)
        table, fields, samples = headroom_table(session, cfg.evaluate.steps, cfg.evaluate.samples)
        text = headroom_markdown(table, fields, samples)
        path = Path(cfg.run_dir) / "headroom.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# What {cfg.data.path or cfg.data.open_dataset} holds at the first lead\n\n{text}\n")
        tracker = open_tracker(cfg, dims, 0, {"kind": "headroom"})
        tracker.log_evaluation(0, table.metrics())  # eval/rmse/<variable>/field_ridge/<lead>, ...
        tracker.log_artifact(path)
        tracker.finish()
        return text


def run(cfg: DictConfig | RunConfig) -> str:
    """:func:`headroom_on_rank` on one local rank, after the launcher's checks."""
    return launcher.run(cfg, Command("headroom", trains=False, adopt=one_untrained_rank), headroom_on_rank)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    text = run_reporting_errors(run, cfg, interrupted="nothing written")  # headroom.md, MLflow: at the end only
    print(text)


if __name__ == "__main__":
    from training.launch.launcher import main

    main(_hydra_main)
