"""What rank 0 reports of a run: the MLflow run (continued when the run resumes), the resolved
configuration, and the pictures and tables at its end."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from processor.host import cpu_name
from processor.runtime.torchrun import torchrun_rank
from training.config.schema import RunConfig
from training.config.settings import flatten, to_settings, write_settings
from training.data import ZarrDataset
from training.distributed.parallel import ParallelDims
from training.reporting.metrics_file import read_history
from training.reporting.tracking import NullTracker, RecordOnly, Tracker
from training.skill.by_lead import skill_summary
from training.skill.calibration import UNCALIBRATED
from training.skill.scores import SkillTable

log = logging.getLogger(__name__)


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def open_tracker(cfg: RunConfig, dims: ParallelDims, start: int, tags: dict[str, str] | None = None):
    """Rank 0's :class:`Tracker` (continuing the run directory's MLflow run when ``start`` > 0),
    with the resolved configuration as params and artifact, or with ``logging.mlflow = false``
    its :class:`RecordOnly` (``metrics.jsonl`` and ``evaluations.jsonl`` all the same); a
    :class:`NullTracker` elsewhere."""
    run_dir = Path(cfg.run_dir)
    if dims.rank != 0:
        return NullTracker()
    if not cfg.logging.mlflow:
        return RecordOnly(run_dir, start)
    tags = {
        "strategy": cfg.strategy.name,
        "ranks": str(dims.world),
        "ranks_per_model": str(dims.mp),
        "device": str(cfg.trainer.device),
        "grid": cfg.data.grid,
        "hidden_grid": cfg.model.hidden_grid,
        "attention_path": cfg.model.attention_path,  # auto's measured pick (model.attention_auto.* has its times)
        "host": cpu_name(),  # the CPU kind: figures from another kind differ
        "git_commit": git_commit(),
        "resumed_from_step": str(start),
        **(tags or {}),
    }
    logging_cfg = cfg.logging
    tracker = Tracker(
        run_dir,
        logging_cfg.tracking_uri,
        logging_cfg.experiment,
        logging_cfg.run_name,
        flatten(to_settings(cfg)),
        tags,
        resume=start > 0,
        start_step=start,
    )
    tracker.log_artifact(write_settings(cfg))
    return tracker


def variable_units(dataset: ZarrDataset) -> dict[str, str]:
    """The units of the dataset's variables where its store says them: a ``units`` attribute
    (``{variable: unit}``) or ``variables_metadata.<variable>.units``; else none (the built-in
    dataset's fields are non-dimensional)."""
    path = getattr(dataset, "path", None)
    if path is None:
        return {}
    try:
        attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except Exception:  # not a Zarr group of ours (an anemoi open_dataset source): no units
        return {}
    given = attrs.get("units") if isinstance(attrs.get("units"), dict) else {}
    meta = attrs.get("variables_metadata") if isinstance(attrs.get("variables_metadata"), dict) else {}
    units = {}
    for v in dataset.variables:
        entry = meta.get(v)
        unit = given.get(v) or (entry.get("units") if isinstance(entry, dict) else None)
        if isinstance(unit, str) and unit:
            units[v] = unit
    return units


def final_pictures(
    tracker,
    run_dir: Path,
    dataset: ZarrDataset,
    forecast: np.ndarray,
    sample: tuple[int, int] | None = None,
    lead: int = 1,
    further: list[tuple[str, int]] | None = None,
) -> None:
    """The loss curve of the whole run (every resumed segment, from ``metrics.jsonl``) and a
    map of one forecast of every output variable: ``forecast`` ``(2, points, outputs + extra)``
    normalised truth and forecast from ``sample`` (``(date index, member)``, the input's)
    ``lead`` dates on (``Samples.lead``), whose lead and valid date the map names (unknown
    without ``sample``); ``further``: the extra columns, each a variable ``steps`` leads on."""
    from training.reporting.plots import forecast_map, loss_curve  # deferred: matplotlib (0.7 s)

    history = read_history(run_dir)
    if history:
        tracker.log_artifact(loss_curve(history, run_dir / "loss_curve.png"))
    further = further or []
    outputs = dataset.roles.outputs
    columns = list(range(len(outputs))) + [outputs.index(v) for v, _ in further]
    truth, pred = (_denormalise_columns(dataset, forecast[i], columns) for i in (0, 1))
    dates, extra_rows = {}, []
    if sample is not None:
        dates = {"initial_date": dataset.date(sample[0]), "valid_date": dataset.date(sample[0] + lead)}
        hours = lead * dataset.frequency_s / 3600
        extra_rows = [(k * hours, dataset.date(sample[0] + k * lead)) for _, k in further]
    path = forecast_map(
        dataset.latitudes,
        dataset.longitudes,
        truth,
        pred,
        [*outputs, *(v for v, _ in further)],
        run_dir / "forecast_map.png",
        lead_hours=lead * dataset.frequency_s / 3600 if sample is not None else None,
        units=variable_units(dataset),
        extra_rows=extra_rows or None,
        **dates,
    )
    tracker.log_artifact(path)


def _denormalise_columns(dataset: ZarrDataset, values: np.ndarray, columns: list[int]) -> np.ndarray:
    """``values`` ``(points, len(columns))`` normalised, column ``c`` being model output
    ``columns[c]`` -> physical units: :meth:`ZarrDataset.denormalise_outputs` of those columns."""
    return values * dataset.output_stdev[columns] + dataset.output_mean[columns]


def report_skill(
    table: SkillTable,
    directory: Path,
    tracker,
    model_step: int,
    units: dict[str, str] | None = None,
    plot: bool = True,
) -> str:
    """Write the table (``skill.md``, ``skill.csv``) and, when ``plot``, its plot
    (``rmse_by_lead.png``, its axes in each variable's ``units`` where the store names them) to
    ``directory``, log them as artifacts and the scores as one evaluation with ``tracker``
    (:meth:`SkillTable.metrics`, all at ``model_step``: the training step of the model scored, its
    checkpoint's step); return the table as markdown."""
    directory.mkdir(parents=True, exist_ok=True)
    text = f"Model after training step {model_step}."
    if UNCALIBRATED in table.kinds:
        text += (
            " The model's forecast calibrated per lead (training/skill/calibration.py: on the calibration"
            " period where the run holds one out, data.calibration_fraction, else on the training dates);"
            f" its own forecast is `{UNCALIBRATED}`."
        )
    text += "\n\n" + table.to_markdown()
    (directory / "skill.md").write_text(text + "\n")
    table.to_csv(directory / "skill.csv")
    tracker.log_evaluation(model_step, table.metrics())
    paths = [directory / "skill.md", directory / "skill.csv"]
    if plot:
        from training.reporting.plots import rmse_by_lead  # deferred: matplotlib (0.7 s), only to draw

        paths.append(rmse_by_lead(table, directory / "rmse_by_lead.png", units))
    for path in paths:
        tracker.log_artifact(path)
    return text


def log_skill(skill: Any, run_dir: str, plot: bool = True) -> None:
    """Log the skill summary of rank 0's result (the ranks may be spawned processes, whose logs
    do not reach the console), and where the full tables and (``plot``) the plot are."""
    if skill is None or torchrun_rank() != 0:
        return
    where = f"full tables (climatology, ACC): {run_dir}/skill.md"
    if plot:
        where += f"; plot: {run_dir}/rmse_by_lead.png"
    summary = skill_summary(skill)
    log.info("RMSE by lead time (area-weighted, physical units), model / persistence:\n%s\n%s", summary, where)
