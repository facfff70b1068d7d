"""The parity check on every rank (:func:`parity_on_rank`) and its launch (:func:`run`): the
command is :mod:`training.parity.__main__`."""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from processor.runtime.torchrun import under_torchrun
from training.config.parity_settings import tolerance_of
from training.config.schema import ConfigValueError, RunConfig
from training.distributed.device import launch_world
from training.distributed.parallel import ParallelDims
from training.distributed.ranks import join_ranks
from training.launch.command import Command
from training.launch.interrupt import StopRequest, stop_requests
from training.launch.launcher import run as launch
from training.parity.compare import Difference, compare, table, within, worst_by_step, worst_of, write_csv
from training.parity.layouts import check_parity, reference_config, reference_layout
from training.parity.record import ParityStopped, StepRecord, record_steps
from training.reporting.report import open_tracker

EXIT_BREACH = 4  # a difference beyond the tolerance: the layouts do not agree
# The local ranks where trainer.nprocs is left to derive: a split to check against one rank (a
# run derives one rank for a small grid, which has nothing to compare).
PARITY_RANKS = 2


def parity_on_rank(cfg: RunConfig) -> dict[str, Any]:
    """Every rank: the reference layout's steps, then the configured layout's; rank 0 compares,
    writes ``parity.csv`` and the MLflow run. Returns (every rank) whether the tolerance was
    breached and, on rank 0, the rows, the table, the verdict and both layouts' times; or, when
    a stop signal came (Ctrl-C, SIGTERM), ``stopped``: the signal, after the step in flight."""
    dims, heartbeat = join_ranks(cfg.trainer)
    keep = dims.rank == 0
    with heartbeat, stop_requests(cfg.run_dir) as stop:
        should_stop = functools.partial(_agreed_stop, dims, stop)
        try:
            reference_cfg = reference_config(cfg, dims.world)
            start = time.perf_counter()
            reference = _record_reference(reference_cfg, dims, keep, should_stop)
            middle = time.perf_counter()
            configured = record_steps(cfg, dims, keep, should_stop)
        except ParityStopped:
            return {"stopped": stop.signum, "breach": False}
        times = (middle - start, time.perf_counter() - middle)
        result: dict[str, Any] = {}
        if keep:
            result = _report(cfg, reference_cfg, dims, compare(reference, configured), times)
        breach = dims.max_over_world([float(result.get("breach", 0.0))])[0] > 0
    return {**result, "breach": breach}


def _agreed_stop(dims: ParallelDims, stop: StopRequest) -> bool:
    """Whether any rank of the world was asked to stop (every rank calls, together)."""
    return dims.sum_over_world([float(stop.requested)])[0] > 0


def _record_reference(
    reference_cfg: RunConfig, dims: ParallelDims, keep: bool, should_stop: Callable[[], bool]
) -> list[StepRecord]:
    """The reference layout's records (this rank a copy of it); its memory freed after."""
    reference, batch = reference_cfg.parity.reference, reference_cfg.trainer.batch_size
    try:
        with reference_layout(reference, dims) as reference_dims:
            records = record_steps(reference_cfg, reference_dims, keep, should_stop)
    except torch.OutOfMemoryError as exc:
        raise ConfigValueError(
            f"parity.reference = {reference}: the reference layout ({reference} rank(s), one replica with every "
            f"replica's samples: a batch of {batch}) does not fit its device ({str(exc).splitlines()[0]}); give a "
            "larger parity.reference (at most trainer.ranks_per_model) or a smaller trainer.batch_size"
        ) from None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return records


def describe(cfg: RunConfig, world: int) -> str:
    """``shard_sequence on 2 ranks (2 per model)``."""
    return f"{cfg.strategy.name} on {world} rank(s) ({cfg.trainer.ranks_per_model} per model)"


def _report(
    cfg: RunConfig, reference_cfg: RunConfig, dims: ParallelDims, rows: list[Difference], times: tuple[float, float]
) -> dict[str, Any]:
    """Rank 0: the verdict, ``parity.csv`` and the MLflow run; what :func:`parity_on_rank` returns."""
    tolerance = tolerance_of(cfg.parity, cfg.trainer.precision)
    ok, worst = within(rows, tolerance), worst_of(rows)
    layouts = (
        f"{describe(cfg, dims.world)} against {describe(reference_cfg, reference_cfg.parity.reference)}, "
        f"{cfg.parity.steps} step(s)"
    )
    where = f"{worst.quantity}" + ("" if worst.quantity == "loss" else f" of {worst.tensor}")
    blind = sorted({r.tensor for r in rows if not r.judged})
    verdict = (
        f"parity: {'within' if ok else 'BREACH of'} {tolerance:g} ({cfg.trainer.precision}): worst "
        f"relative difference {worst.max_rel_diff:.3g}, {where} at step {worst.step}; {layouts}"
        + (f"; {len(blind)} parameter(s) the loss is blind to not judged (parity.csv)" if blind else "")
    )
    csv_path = write_csv(rows, Path(cfg.run_dir) / "parity.csv")
    tags = {"kind": "parity", "parity_verdict": "within" if ok else "breach", "parity_worst_tensor": worst.tensor}
    tracker = open_tracker(cfg, dims, 0, tags)
    worst_rows = worst_by_step(rows)
    for step in range(cfg.parity.steps):
        tracker.log_metrics(step, {f"parity/{r.quantity}": r.max_rel_diff for r in worst_rows if r.step == step})
    tracker.log_artifact(csv_path)
    tracker.finish()
    return {
        "rows": rows,
        "table": table(rows),
        "verdict": verdict,
        "breach": not ok,
        "reference_s": times[0],
        "configured_s": times[1],
        "run_id": tracker.run_id,
    }


def check_parity_run(resolved: RunConfig) -> None:
    """Before any rank starts: refuse, in one line, what no parity check can run."""
    world = launch_world(resolved.trainer.nprocs)
    check_parity(resolved, world)
    if resolved.strategy.name != "auto":  # auto is resolved later; the ranks check it then
        reference_config(resolved, world)


def split_for_parity(resolved: RunConfig) -> None:
    """On a CPU, local ranks left to derive become :data:`PARITY_RANKS` (in place, on the
    launcher's resolved copy): a GPU keeps its rank a GPU, torchrun its world."""
    trainer = resolved.trainer
    if trainer.nprocs is None and trainer.device == "cpu" and not under_torchrun():
        trainer.nprocs = PARITY_RANKS


def run(cfg: DictConfig | RunConfig) -> dict[str, Any]:
    """:func:`parity_on_rank` on the configured ranks (local or torchrun; see
    :func:`split_for_parity`), after the checks."""
    command = Command("parity", trains=True, adopt=split_for_parity, check=check_parity_run)
    return launch(cfg, command, parity_on_rank)
