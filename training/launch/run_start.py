"""What a run says at start, in one line: the strategy, data-parallel x model-parallel ranks,
the data and hidden grids, the device, the run directory and the MLflow store and run. Logged
by the process that prepares the run (the launcher, or torchrun's rank 0), whose log reaches
the console."""

from __future__ import annotations

from pathlib import Path

import torch

from training.config.schema import RunConfig, TrainerConfig, run_processor_config
from training.distributed.device import launch_world
from training.reporting.mlflow_store import local_store_uri, read_record


def _device(trainer_cfg: TrainerConfig, share_gpu: bool) -> str:
    if trainer_cfg.device != "cuda":
        return f"cpu, {trainer_cfg.threads_per_rank} thread(s) per rank"
    name = torch.cuda.get_device_name(0)
    shared = " SHARED by the ranks (debug.share_gpu: tests only)" if share_gpu else ""
    return f"cuda ({name}){shared}"


def _mlflow(cfg: RunConfig) -> str:
    logging_cfg, run_dir = cfg.logging, Path(cfg.run_dir)
    if not logging_cfg.mlflow:
        return "MLflow off (metrics.jsonl only)"
    store = logging_cfg.tracking_uri or local_store_uri(run_dir)
    record = read_record(run_dir)
    run = f"run {record['run_id']}" if record and record.get("run_id") else "a new run"
    return f"MLflow {store}, experiment {logging_cfg.experiment}, {run}"


def startup_line(cfg: RunConfig, data_points: int, hidden_points: int) -> str:
    """The line, for the resolved configuration ``cfg``, a dataset of ``data_points`` points and
    a hidden grid of ``hidden_points``."""
    trainer_cfg = cfg.trainer
    world = launch_world(trainer_cfg.nprocs)
    mp = trainer_cfg.ranks_per_model
    hidden = cfg.model.hidden_grid + (f" every {cfg.model.hidden_stride}" if cfg.model.hidden_stride > 1 else "")
    return (
        f"strategy {cfg.strategy.name} on {world // mp} data-parallel x {mp} model-parallel rank(s)"
        f"{_mesh(cfg)}; "
        f"data {cfg.data.grid} ({data_points} points) -> hidden {hidden} "
        f"({hidden_points} points); device {_device(trainer_cfg, cfg.debug.share_gpu)}; "
        f"run dir {cfg.run_dir}; {_mlflow(cfg)}"
    )


def _mesh(cfg: RunConfig) -> str:
    """`` (mesh: points 2 x channels 1 x heads 1)``: how the strategy lays a model group out."""
    mp = cfg.trainer.ranks_per_model
    if mp == 1:
        return ""
    processor = run_processor_config(cfg)
    return f" (mesh: {processor.resolved_strategy().degrees(processor.num_heads, mp).describe()})"
