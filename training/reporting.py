"""What rank 0 reports of a run: the MLflow run (continued when the run resumes), the resolved
configuration, and the pictures and tables at its end."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from training.data import ZarrDataset
from training.metrics_file import read_history
from training.parallel import ParallelDims
from training.tracking import NullTracker, Tracker, flatten

log = logging.getLogger(__name__)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def open_tracker(cfg: dict[str, Any], dims: ParallelDims, start: int, tags: dict[str, str] | None = None):
    """Rank 0's :class:`Tracker` (continuing the run directory's MLflow run when ``start`` > 0),
    with the resolved configuration as params and artifact; a :class:`NullTracker` elsewhere."""
    if dims.rank != 0 or not cfg["logging"]["mlflow"]:
        return NullTracker()
    run_dir = Path(cfg["run_dir"])
    tags = {
        "strategy": cfg["strategy"]["name"],
        "ranks": str(dims.world),
        "ranks_per_model": str(dims.mp),
        "device": str(cfg["trainer"].get("device", "cpu")),
        "grid": cfg["data"]["grid"],
        "hidden_grid": cfg["model"]["hidden_grid"],
        "git_commit": git_commit(),
        "resumed_from_step": str(start),
        **(tags or {}),
    }
    logging_cfg = cfg["logging"]
    tracker = Tracker(
        run_dir,
        logging_cfg["tracking_uri"],
        logging_cfg["experiment"],
        logging_cfg["run_name"],
        flatten(cfg),
        tags,
        resume=start > 0,
        start_step=start,
    )
    config_file = run_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    tracker.log_artifact(config_file)
    return tracker


def final_pictures(tracker, run_dir: Path, dataset: ZarrDataset, forecast: np.ndarray) -> None:
    """The loss curve of the whole run (every resumed segment, from ``metrics.jsonl``) and a
    map of one forecast: ``forecast`` ``(2, points, variables)`` normalised truth and forecast."""
    from training.plots import forecast_map, loss_curve

    history = read_history(run_dir)
    if history:
        tracker.log_artifact(loss_curve(history, run_dir / "loss_curve.png"))
    truth, pred = dataset.denormalise(forecast[0]), dataset.denormalise(forecast[1])
    v = dataset.variables.index("tracer") if "tracer" in dataset.variables else 0
    path = forecast_map(
        dataset.latitudes,
        dataset.longitudes,
        truth[:, v],
        pred[:, v],
        dataset.variables[v],
        run_dir / "forecast_map.png",
    )
    tracker.log_artifact(path)
