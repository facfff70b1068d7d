"""``python -m benchmarks``: time the sharded processor (or a whole training step) at one point,
or over a sweep with ``--multirun``. Each point runs on freshly spawned ranks.

python -m benchmarks grid=o96 strategy=shard_sequence ranks=2
python -m benchmarks --multirun model.num_layers=2,4,8 grid=o32,o48,o96 \\
    strategy=none,shard_heads,shard_sequence ranks=1,2,4
python -m benchmarks --multirun target=train_step grid=o32,o48 strategy=shard_sequence ranks=1,2
python -m benchmarks device=cuda ranks=4 precision=bf16    # NCCL, one GPU per rank
torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
    -m benchmarks --multirun ranks=1,2,4 strategy=shard_sequence   # on torchrun's ranks (rank 0 writes)

Rows go to ``results.jsonl`` in the sweep directory (``benchmarks/results/<date>``), then
``results.csv``, ``results.md`` and ``plots/`` at the end, and to MLflow (a parent run per
sweep, a child run per point; ``mlflow ui --backend-store-uri sqlite:///benchmarks/results/mlflow.db``).
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import benchmarks.config  # noqa: F401 - registers the schema
from benchmarks.config import BenchmarkConfig, check_point, point_config, skip_reason, strategy_options
from benchmarks.point import machine, run_point
from benchmarks.results import (
    ANALYTIC_LAYER_COLUMN,
    MIB,
    PEAK_COLUMN,
    POINT_KEYS,
    SENT_LAYER_COLUMN,
    SENT_STEP_COLUMN,
    append_row,
)
from benchmarks.sweep import parent_run_id, tracker_for, write_outputs
from processor.runtime.torchrun import torchrun_rank, under_torchrun
from training.config.auto_attention import rank_probe_shape, resolve_attention_path, wants_probe
from training.config.schema import processor_config
from training.config.settings import to_settings

log = logging.getLogger(__name__)


def _describe(cfg: BenchmarkConfig) -> dict[str, Any]:
    """The point's settings as a row's columns: :data:`POINT_KEYS` first, the model's flattened in."""
    from processor.grids import grid_points

    settings = to_settings(cfg)
    flat = {**{k: v for k, v in settings.items() if k not in ("model", "logging")}, **settings["model"]}
    flat["points"] = grid_points(cfg.grid)
    return {k: flat.get(k) for k in POINT_KEYS} | {k: v for k, v in flat.items() if k not in POINT_KEYS}


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool) and k not in POINT_KEYS
    }


def done_line(overrides: str, row: dict[str, Any]) -> str:
    """The console line of a measured point, its bytes under the names results.md uses."""
    return (
        f"done  {overrides}: {row['step_time_s']:.3f} s/step "
        f"({row['step_time_min_s']:.3f}-{row['step_time_max_s']:.3f}), "
        f"{row['processor_flop_per_s'] / 1e9:.1f} GFLOP/s, "
        f"{PEAK_COLUMN} {row['peak_increase_bytes_max'] / MIB:.0f}, "
        f"{SENT_STEP_COLUMN} {row['bytes_sent_per_step_max'] / MIB:.2f}, "
        f"{SENT_LAYER_COLUMN} {row['bytes_sent_per_layer_max'] / MIB:.2f}, "
        f"{ANALYTIC_LAYER_COLUMN} {row['analytic_bytes_per_layer_max'] / MIB:.2f}"
    )


def _resolve_attention(cfg: BenchmarkConfig) -> None:
    """``model.attention_path=auto``: the fastest path for one rank's call, measured or cached
    (training/config/auto_attention.py); under torchrun each rank would time on its own, so there the
    static rule stays."""
    if under_torchrun() or not wants_probe(cfg.model):
        return
    from processor.grids import grid_points

    strategy = processor_config(cfg.model, cfg.strategy, strategy_key="strategy", **strategy_options(cfg)).strategy
    shape = rank_probe_shape(cfg.model, strategy, grid_points(cfg.grid), cfg.ranks, cfg.batch_size, cfg.precision)
    resolve_attention_path(cfg.model, shape, cfg.device, cfg.threads_per_rank)


@hydra.main(config_path="pkg://configs.benchmark", config_name="benchmark", version_base=None)
def main(composed: DictConfig) -> None:
    cfg = point_config(composed)
    check_point(cfg)
    _resolve_attention(cfg)
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    directory = Path(hc.sweep.dir if multirun else hc.runtime.output_dir)
    overrides = " ".join(hc.overrides.task)
    row: dict[str, Any] = {**_describe(cfg), "overrides": overrides, **machine()}

    reporter = torchrun_rank() == 0  # under torchrun every rank measures, rank 0 reports
    reason = skip_reason(cfg)
    if reason is not None:
        row |= {"status": "skipped", "reason": reason}
        if reporter:
            print(f"skip  {overrides}: {reason}")
    else:
        try:
            row |= run_point(cfg)
        except (RuntimeError, ValueError) as exc:  # one failing point does not end the sweep
            row |= {"status": "error", "error": str(exc) or traceback.format_exc()}
            if reporter:
                log.error("point %s failed: %s", overrides, exc)
            if not multirun:
                if reporter:
                    append_row(directory, row)
                raise
        else:
            if reporter:
                print(done_line(overrides, row))
    if not reporter:
        return
    append_row(directory, row)
    tracker = tracker_for(cfg.logging, cfg.results_root)
    if tracker is not None and row["status"] != "skipped":
        parent = parent_run_id(directory) if multirun else None
        tags = {"status": row["status"], "strategy": row["strategy"], "grid": row["grid"], "host": str(row["cpu"])}
        tags["attention_path"] = str(row.get("attention_path"))  # auto's measured pick where it probed
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = tracker.start_run(overrides or "default", {k: row[k] for k in POINT_KEYS}, tags)
        tracker.log_metrics(run, _metrics(row))
        tracker.finish(run, "FINISHED" if row["status"] == "ok" else "FAILED")
    if not multirun:
        write_outputs(directory)


if __name__ == "__main__":
    from training.launch.launcher import main as launch  # torchrun ranks but 0 get Hydra overrides that write nothing

    launch(main, check_command_line=False)
