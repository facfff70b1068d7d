"""The training loop, run on every rank. Its pieces live beside it and decide for themselves:
set-up in :mod:`training.session`, one step in :mod:`training.loop.step`, the rollout in
:mod:`training.model.rollout`, checkpoints in :mod:`training.checkpoint.checkpointer`, validation in
:mod:`training.skill.validation`, the end-of-run report in :mod:`training.reporting.end_of_run`,
step hooks in :mod:`training.hooks`."""

from __future__ import annotations

import functools
import gc
import logging
import math
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from processor.runtime import peak_rss
from training.checkpoint.best import BestOnValidation
from training.checkpoint.checkpointer import Checkpointer
from training.config.schema import RunConfig, TrainerConfig
from training.distributed.device import PeakDeviceMemory, synchronize
from training.distributed.ranks import join_ranks
from training.hooks import load_hooks
from training.launch.interrupt import StopRequest, stop_requests
from training.loop.step import build_step
from training.loop.weight_average import WeightAverage
from training.model.rollout import rollout_horizon
from training.reporting.end_of_run import final_report
from training.reporting.report import open_tracker, variable_units
from training.reporting.step_split import StepSplit, profile_after
from training.session import Session, open_session
from training.skill.by_lead import evaluation_samples
from training.skill.validation import Validator

__all__ = ["RUN_DONE", "sample_positions", "train"]

# Early stops that end the run (it has trained enough): evaluated as a run of every step is.
RUN_DONE = ("patience", "time_budget")

log = logging.getLogger(__name__)


def sample_positions(step: int, replica: int, replicas: int, batch: int, n: int, seed: int) -> list[int]:
    """Positions in the ``n`` training samples of this replica's batch at ``step``: epoch-wise
    shuffles, a function of the step alone, so a resumed run reads exactly what the
    uninterrupted one would have."""
    positions = []
    for j in range(batch):
        epoch, pos = divmod((step * replicas + replica) * batch + j, n)
        positions.append(int(np.random.default_rng([seed, epoch]).permutation(n)[pos]))
    return positions


def train(cfg: RunConfig) -> dict[str, Any]:
    """Train on this rank; rank 0 logs and checkpoints. Returns the loss history, the MLflow
    run id, the step it started from and (when evaluated) the skill table.

    On several ranks a heartbeat runs alongside (:func:`training.distributed.ranks.join_ranks`).
    """
    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat, stop_requests(cfg.run_dir) as stop:
        return Trainer(open_session(cfg, dims, rollout_horizon(cfg.trainer)), stop).run()


class Trainer:
    """Optimiser, schedule and step of one rank, restored from the run's checkpoint if any."""

    def __init__(self, session: Session, stop: StopRequest | None = None) -> None:
        self.session, cfg, dims = session, session.cfg, session.dims
        self.stop = stop or StopRequest()  # a signal asks every rank to stop after its step
        self.stopped: str | None = None  # why the loop ended early: "stop_at_step" or "signal"
        self.stop_agreed = False
        self.trainer_cfg = cfg.trainer
        self.step_fn = build_step(session)  # the model parallelised (and compiled), AdamW, its schedule
        self.schedule = self.step_fn.schedule  # read for the step's lr (benchmarks wrap step_fn itself)
        torch.manual_seed(self.trainer_cfg.seed + 1 + dims.rank)  # dropout streams differ per rank
        if cfg.evaluate.at_end_of_training:  # fails now, not after training, if it cannot
            evaluation_samples(session, cfg.evaluate.steps, cfg.evaluate.samples)
        self.hooks = load_hooks(cfg, dims.rank, dims.world)  # debug.hooks: none by default
        decay = self.trainer_cfg.weight_average
        self.average = WeightAverage(session.model, decay) if decay is not None else None
        self.checkpointer = Checkpointer(session, self.step_fn.optimiser, self.schedule, self.hooks, self.average)
        self.start = self.checkpointer.restore()
        self.last_step_s = 0.1
        self.budget_agreed = False
        self.device_memory = PeakDeviceMemory(session.device)
        self.step_split = StepSplit(session.model, self.start, profile_after(cfg, session.device), dims.mean_over_world)
        self.validator = Validator(session, self.step_fn.loss, variable_units(session.dataset))
        if self.start < self.trainer_cfg.steps:  # steps to train: their samples' field forecasts, once
            session.model.remember_field_forecasts(session.batches, session.samples.train)

    def run(self) -> dict[str, Any]:
        """Train from the start step to ``trainer.steps`` (or ``stop_at_step``), then report."""
        reason = nothing_to_do(self.trainer_cfg, self.start, self.checkpointer)
        if reason is not None:
            if self.session.dims.rank == 0:
                log.info("%s; nothing to train", reason)
            return {**run_result(self, [], None, None), "reason": reason}
        self.checkpointer.remove_partials()
        self.tracker = open_tracker(self.session.cfg, self.session.dims, self.start)
        skill = None
        try:
            history = self.loop()
            # A stop (trainer.stop_at_step, a signal) is not the end: no final evaluation unless asked.
            if history and (self.stopped in (None, *RUN_DONE) or self.session.cfg.evaluate.at_stop):
                skill = final_report(self.session, self.tracker, self.checkpointer.load_best())
        except BaseException as exc:
            self.tracker.finish("FAILED", reason=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.hooks.close()
        self.tracker.finish()
        return run_result(self, history, self.tracker.run_id, skill)

    def loop(self) -> list[tuple[int, dict[str, float]]]:
        """Train the steps (validating, logging and checkpointing as due); each step's metrics."""
        # The set-up's ~400k objects (modules, imports, configs) leave the collector's view while
        # the loop runs: each full collection went through them all, 0.2 s (INCA Graz, Zen 5).
        # Its garbage goes first; what a caller froze before stays frozen.
        ours = gc.get_freeze_count() == 0
        if ours:
            gc.collect()
            gc.freeze()
        try:
            return self._steps()
        finally:
            if ours:
                gc.unfreeze()

    def _steps(self) -> list[tuple[int, dict[str, float]]]:
        history: list[tuple[int, dict[str, float]]] = []
        trainer_cfg, log_interval = self.trainer_cfg, self.session.cfg.logging.log_interval
        shown = self.session.dims.rank == 0
        self.clock = time.perf_counter()
        with tqdm(
            total=trainer_cfg.steps, initial=self.start, desc="train", disable=not shown, dynamic_ncols=True
        ) as bar:
            for step in range(self.start, trainer_cfg.steps):
                with self.step_split.around(step) as profiled:  # filled in as the step ends
                    metrics = self.one_step(step)
                metrics |= profiled
                if self.validator.due(step):
                    metrics |= self.validate(step)
                history.append((step, metrics))
                if step % log_interval == 0 or "val/loss" in metrics or profiled:
                    self.tracker.log_metrics(step, metrics)
                bar.set_postfix(progress_fields(metrics, self.validator, self.checkpointer.best))
                bar.update()
                self.stopped = early_stop(
                    self.trainer_cfg, step, self.stop_agreed, self.budget_agreed, self.checkpointer.best
                )
                self.checkpointer.save(step + 1, self.trained_s(), stopping=self.stopped is not None)
                if self.stopped:
                    break
        return history

    def validate(self, step: int) -> dict[str, float]:
        """Validate the model after ``step`` and keep it when it is the best so far; the metrics,
        with the best validation loss and its step."""
        with self.average.applied() if self.average is not None else nullcontext():
            metrics = self.validator.validate()
        self.checkpointer.validated(
            step + 1, metrics["val/loss"], self.validator.rollout, self.trainer_cfg.rollout.step_decay
        )
        best = self.checkpointer.best
        return metrics | {"val/best_loss": best.loss, "val/best_step": float(best.step or 0)}

    def trained_s(self) -> float:
        """Seconds of training in this run so far (steps and validations)."""
        return time.perf_counter() - self.clock

    def out_of_time(self) -> bool:
        """Whether this rank has trained ``trainer.time_budget_min``, earlier runs included."""
        budget = self.trainer_cfg.time_budget_min
        return budget is not None and self.checkpointer.trained_s_before + self.trained_s() >= 60 * budget

    def one_step(self, step: int) -> dict[str, float]:
        """One optimiser step; its metrics, summed over the ranks."""
        s, trainer_cfg, dims = self.session, self.trainer_cfg, self.session.dims
        picks = sample_positions(
            step, dims.dp_rank, dims.dp, trainer_cfg.batch_size, len(s.samples.train), trainer_cfg.seed
        )
        rollout = trainer_cfg.rollout.steps_at(step)
        t0 = time.perf_counter()
        lr = self.schedule.get_last_lr()[0]
        s.counter.reset()
        self.device_memory.reset()
        samples = [s.samples.train[i] for i in picks]
        batch = s.batches(samples, rollout)
        self.hooks.start_step(step, self.last_step_s)
        x = self.hooks.model_inputs(step, batch.x)
        after_backward = functools.partial(self.hooks.after_backward, step)
        with s.model.out_of_fold(samples, given=batch.x):
            loss = self.step_fn(x, batch.targets, s.grids, s.model_group, s.transport, after_backward, batch.forcings)
        if self.average is not None:
            self.average.update()
        synchronize(s.device)  # the step's time includes the work queued on the GPU
        elapsed = self.last_step_s = time.perf_counter() - t0
        train_loss, peak, sent, stops, over_budget = dims.sum_over_world(
            [loss.item(), peak_rss() / 2**30, s.counter.total_bytes, float(self.stop.requested), self.out_of_time()]
        )
        train_loss /= dims.dp
        self.stop_agreed = stops > 0  # a rank was signalled: every rank stops after this step
        self.budget_agreed = over_budget > 0  # a rank's clock ran out: every rank stops after this step
        device_peak = dims.max_over_world([self.device_memory.peak_gib()])[0]
        if not math.isfinite(train_loss):  # equal on every rank: all stop together
            self.tracker.log_metrics(step, {"train/nonfinite_loss": 1.0})
            raise FloatingPointError(
                f"loss is {train_loss} at step {step}: stopping. The last good checkpoint "
                f"(step {self.checkpointer.last}) is in {self.checkpointer.dir}"
            )
        samples_per_s = dims.dp * trainer_cfg.batch_size / elapsed
        return {
            "train/loss": train_loss,
            "train/rollout": float(rollout),
            "lr": lr,
            "step_time_s": elapsed,
            "samples_per_s": samples_per_s,
            "points_per_s": samples_per_s * s.dataset.n_points,
            "peak_rss_gib_mean_rank": peak / dims.world,  # resident high-water mark so far
            "comm_bytes_per_rank": sent / dims.world,
            **({"peak_device_memory_gib": device_peak} if s.device.type == "cuda" else {}),
        }


def run_result(trainer: Trainer, history: list, run_id: str | None, skill) -> dict[str, Any]:
    """What :func:`train` returns: the loss history, the MLflow run, the steps it started and
    ended at, whether it stopped early (and why), and the skill table when evaluated."""
    return {
        "history": history,
        "run_id": run_id,
        "start_step": trainer.start,
        "end_step": history[-1][0] + 1 if history else trainer.start,
        "steps": trainer.trainer_cfg.steps,
        "stopped": trainer.stopped,
        "best_step": trainer.checkpointer.best.step,  # the model on validation scored at the end (keep_best)
        "signal": trainer.stop.signum,  # the signal this rank received, if any
        "skill": skill,
    }


def progress_fields(metrics: dict[str, float], validator: Validator, best: BestOnValidation) -> dict[str, str]:
    """What the progress bar shows after a step: losses, the best validation loss and its step,
    the last validation's RMSE beside the best baseline's, samples/s and, on a GPU, the step's
    peak device memory (the largest over the ranks)."""
    shown = {"loss": f"{metrics['train/loss']:.4f}", **validator.progress()}
    if best.step is not None:
        shown["best"] = f"{best.loss:.4f}@{best.step}"
    shown["samples/s"] = f"{metrics['samples_per_s']:.3g}"
    if "peak_device_memory_gib" in metrics:
        shown["gpu_mem"] = f"{metrics['peak_device_memory_gib']:.2f}GiB"
    return shown


def early_stop(
    trainer_cfg: TrainerConfig, step: int, signalled: bool, over_budget: bool, best: BestOnValidation
) -> str | None:
    """Why the run stops early after ``step``: ``"stop_at_step"``, ``"signal"`` (a rank was
    ``signalled``), ``"patience"`` (``trainer.patience`` validations without a better one),
    ``"time_budget"`` (a rank is ``over_budget``), or None. The last two end the run: it is
    evaluated (:data:`RUN_DONE`)."""
    if step + 1 >= trainer_cfg.steps:
        return None
    if trainer_cfg.stop_at_step is not None and step + 1 >= trainer_cfg.stop_at_step:
        return "stop_at_step"
    if signalled:
        return "signal"
    if best.out_of_patience(trainer_cfg.patience):
        return "patience"
    return "time_budget" if over_budget else None


def nothing_to_do(trainer_cfg: TrainerConfig, start: int, checkpointer: Checkpointer) -> str | None:
    """Why a run at step ``start`` trains no step (already at ``trainer.stop_at_step`` or
    ``trainer.steps``, out of patience or of its time budget), or None."""
    stop, checkpoints, best = trainer_cfg.stop_at_step, checkpointer.dir, checkpointer.best
    if stop is not None and stop <= start:
        return f"trainer.stop_at_step = {stop}: the checkpoint in {checkpoints} is at step {start} already"
    if start >= trainer_cfg.steps:
        return f"trainer.steps = {trainer_cfg.steps}: the checkpoint in {checkpoints} is at step {start}"
    if best.out_of_patience(trainer_cfg.patience):
        return (
            f"trainer.patience = {trainer_cfg.patience}: the checkpoint in {checkpoints} (step {start}) is "
            f"{best.stale} validations past its best ({best.describe()})"
        )
    budget, trained_min = trainer_cfg.time_budget_min, checkpointer.trained_s_before / 60
    if budget is not None and trained_min >= budget:
        return f"trainer.time_budget_min = {budget:g}: the run in {checkpoints} has trained {trained_min:.1f} min"
    return None
