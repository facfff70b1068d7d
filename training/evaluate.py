"""``python -m training.evaluate``: skill by lead time of a saved forecaster.

python -m training.evaluate evaluate.checkpoint=outputs/2026-11-23/10-00-00/checkpoints/latest.pt
python -m training.evaluate evaluate.checkpoint=... evaluate.steps=20 strategy=shard_heads trainer.nprocs=4

Loads a training checkpoint (its model section replaces this configuration's: the architecture
is the checkpoint's; grid and variables must match), rolls it out ``evaluate.steps`` leads from
``evaluate.samples`` validation dates on the configured ranks and strategy, and reports the
area-weighted RMSE and anomaly correlation per variable and lead beside persistence and
climatology: ``skill.md``, ``skill.csv`` and ``rmse_by_lead.png`` in its run directory, and an
MLflow run in the checkpoint's run store unless ``logging.tracking_uri`` names another, tagged
with the checkpoint and its training run: one evaluation, its metrics named with their lead
(``eval/rmse/<variable>/<kind>/<lead>``, see :meth:`training.skill.SkillTable.metrics`)
and logged at the checkpoint's training step.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from training.checkpoint import CheckpointError, load_training_checkpoint
from training.config import ModelConfig, RunConfig
from training.settings import from_settings

log = logging.getLogger(__name__)


def checkpoint_path(cfg: RunConfig, key: str) -> Path:
    """The checkpoint named by ``<key>.checkpoint`` (``key``: ``evaluate`` or ``predict``; None:
    the run directory's latest), which must exist."""
    given = getattr(cfg, key).checkpoint
    path = Path(given) if given else Path(cfg.run_dir) / "checkpoints" / "latest.pt"
    if not path.exists():
        raise CheckpointError(f"{key}.checkpoint: no checkpoint at {path}; give {key}.checkpoint=/path/to/latest.pt")
    return path.resolve()


def adopt_checkpoint(resolved: RunConfig, key: str) -> None:
    """Make ``resolved`` describe the checkpoint's model (``<key>`` is ``evaluate`` or
    ``predict``): its model section and, when unset here, its variables and grid; record the path.
    Runs before the dataset is opened, so grid and variables are checked against the store."""
    path = checkpoint_path(resolved, key)
    _, saved = load_training_checkpoint(path)
    resolved.model = from_settings(ModelConfig, saved["model"])
    data, saved_data = resolved.data, saved.get("data") or {}
    for name in ("variables", "grid", "lead_time"):
        if getattr(data, name) is None:
            setattr(data, name, saved_data.get(name))
    getattr(resolved, key).checkpoint = str(path)
    source_store = path.parent.parent / "mlflow.db"
    if resolved.logging.tracking_uri is None and source_store.exists():
        resolved.logging.tracking_uri = f"sqlite:///{source_store}"  # beside the run it evaluates


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
    from training.evaluation import evaluate_skill, report_skill
    from training.reporting import open_tracker
    from training.resume import load_model_weights
    from training.session import join_ranks, open_session

    dims, heartbeat = join_ranks(cfg)
    with heartbeat:
        session = open_session(cfg, dims)
        checkpoint = Path(cfg.evaluate.checkpoint)
        step = load_model_weights(checkpoint, cfg, dims, session.model)
        table = evaluate_skill(session, cfg.evaluate.steps, cfg.evaluate.samples)
        tags = {"kind": "evaluation", **source_run_tags(checkpoint, step)}
        tracker = open_tracker(cfg, dims, 0, tags)
        if dims.rank == 0:
            report_skill(table, Path(cfg.run_dir), tracker, model_step=step)
        tracker.finish()
        return {"skill": table, "run_id": tracker.run_id, "checkpoint_step": step}


def run(cfg: DictConfig) -> dict[str, Any]:
    """:func:`evaluate_on_rank` on the configured ranks (local or torchrun), after the checks."""
    from training.app import run as run_app

    return run_app(cfg, evaluate_on_rank, adopt=lambda resolved: adopt_checkpoint(resolved, "evaluate"))


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from training.app import log_skill, run_reporting_errors

    result = run_reporting_errors(run, cfg)
    log_skill(result["skill"], cfg.run_dir)


if __name__ == "__main__":
    from training.app import main

    main(_hydra_main)
