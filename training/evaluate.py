"""``python -m training.evaluate``: skill by lead time of a saved forecaster.

python -m training.evaluate evaluate.checkpoint=outputs/2026-11-23/10-00-00/checkpoints/latest.pt
python -m training.evaluate evaluate.checkpoint=... evaluate.steps=20 strategy=shard_heads trainer.nprocs=4

Loads a training checkpoint and takes the settings it was written with (model, data, strategy,
ranks, precision, evaluation settings: :mod:`training.checkpoint.adopt`), with what this command
line sets on top (a setting the parameters depend on must keep the checkpoint's value), rolls it
out ``evaluate.steps`` leads from ``evaluate.samples`` validation dates, and reports the
area-weighted RMSE and anomaly correlation per variable and lead beside persistence and
climatology: ``skill.md``, ``skill.csv`` and ``rmse_by_lead.png`` in its run directory, and an
MLflow run in the checkpoint's run store unless ``logging.tracking_uri`` names another, tagged
with the checkpoint and its training run: one evaluation, its metrics named with their lead
(``eval/rmse/<variable>/<kind>/<lead>``, see :meth:`training.skill.scores.SkillTable.metrics`)
and logged at the checkpoint's training step.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from training.checkpoint.adopt import adopt_checkpoint
from training.checkpoint.resume import load_model_weights
from training.config.schema import RunConfig
from training.distributed.ranks import join_ranks
from training.launch import launcher
from training.launch.command import Command
from training.launch.launcher import run_reporting_errors
from training.launch.run_settings import command_line_keys
from training.reporting.report import log_skill, open_tracker, report_skill
from training.session import open_session
from training.skill.by_lead import evaluate_skill

log = logging.getLogger(__name__)


def source_run_tags(checkpoint: Path, step: int) -> dict[str, str]:
    """Tags naming the checkpoint, its step and (when recorded) its training run."""
    tags = {"checkpoint": str(checkpoint), "checkpoint_step": str(step)}
    record = checkpoint.parent.parent / "mlflow_run.json"
    if record.exists():
        try:
            tags["source_run_id"] = str(json.loads(record.read_text()).get("run_id"))
        except (OSError, ValueError):
            pass
    return tags


def evaluate_on_rank(cfg: RunConfig) -> dict[str, Any]:
    """Every rank: load the checkpoint, score it; rank 0 reports. Returns the table and run id."""
    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat:
        session = open_session(cfg, dims)
        checkpoint = Path(cfg.evaluate.checkpoint)
        step = load_model_weights(checkpoint, cfg, dims, session.model)
        table = evaluate_skill(session, cfg.evaluate.steps, cfg.evaluate.samples)
        tags = {"kind": "evaluation", **source_run_tags(checkpoint, step)}
        tracker = open_tracker(cfg, dims, 0, tags)
        if dims.rank == 0:
            report_skill(table, Path(cfg.run_dir), tracker, model_step=step, plot=cfg.logging.plots)
        tracker.finish()
        return {"skill": table, "run_id": tracker.run_id, "checkpoint_step": step}


def run(cfg: DictConfig | RunConfig, given: list[str] | None = None) -> dict[str, Any]:
    """:func:`evaluate_on_rank` on the configured ranks (local or torchrun), after the checks, with
    the checkpoint's settings under those the command line set (``given``; None: the API's
    configuration as it is, but for the model: :func:`training.checkpoint.adopt.adopt_checkpoint`)."""
    command = Command("evaluate", trains=False, adopt=lambda resolved: adopt_checkpoint(resolved, "evaluate", given))
    return launcher.run(cfg, command, evaluate_on_rank)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    given = command_line_keys(multirun_members=True)
    result = run_reporting_errors(lambda c: run(c, given), cfg, interrupted="no skill table written")
    log_skill(result["skill"], cfg.run_dir, cfg.logging.plots)


if __name__ == "__main__":
    from training.launch.launcher import main

    main(_hydra_main)
