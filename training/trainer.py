"""The training loop, run on every rank. Its pieces live beside it: set-up in
:mod:`training.session`, one step in :mod:`training.step`, the rollout in
:mod:`training.rollout`, checkpoints in :mod:`training.checkpoint.resume`, skill in
:mod:`training.skill.by_lead`, reporting in :mod:`training.reporting.report`."""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from processor.runtime import peak_rss
from training.checkpoint.files import LATEST, remove_partials
from training.checkpoint.resume import restore_training_state, save_training_state
from training.config.schema import RunConfig
from training.distributed.device import PeakDeviceMemory, autocast, synchronize
from training.hooks import load_hooks
from training.launch.interrupt import StopRequest, stop_requests
from training.reporting.report import final_pictures, open_tracker, report_skill, variable_units
from training.reporting.step_split import StepSplit
from training.rollout import RolloutSchedule, loss_weights, rollout
from training.session import Session, join_ranks, open_session, rollout_horizon
from training.skill.by_lead import evaluate_skill, evaluation_samples
from training.skill.validation import ValidationSkill, forward_outputs
from training.step import TrainStep, build_optimiser

__all__ = ["sample_positions", "train", "train_step"]

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

    On several ranks a heartbeat runs alongside (:func:`training.session.join_ranks`).
    """
    dims, heartbeat = join_ranks(cfg)
    with heartbeat, stop_requests(cfg.run_dir) as stop:
        return Trainer(open_session(cfg, dims, rollout_horizon(cfg.trainer)), stop).run()


def train_step(
    session: Session, optimiser: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LambdaLR
) -> TrainStep:
    """The step of ``session``'s run: its model parallelised over the ranks, ``optimiser`` and
    ``schedule``, the run's clipping, precision and loss weights."""
    t_cfg, dataset = session.cfg.trainer, session.dataset
    outputs = dataset.roles.outputs
    weights = loss_weights(t_cfg.loss, outputs, dataset.area_weights, session.points)
    model = session.dims.parallelize(session.model)
    return TrainStep(
        torch.compile(model) if t_cfg.compile else model,
        optimiser,
        schedule,
        t_cfg.grad_clip,
        autocast(session.device, t_cfg.precision),
        t_cfg.batch_size * dataset.n_points * len(outputs),  # a replica's points x variables
        None if weights is None else weights.to(session.device),
    )


class Trainer:
    """Optimiser, schedule and step of one rank, restored from the run's checkpoint if any."""

    def __init__(self, session: Session, stop: StopRequest | None = None) -> None:
        self.session = session
        self.stop = stop or StopRequest()  # a signal asks every rank to stop after its step
        self.stopped: str | None = None  # why the loop ended early: "stop_at_step" or "signal"
        self.stop_agreed = False
        cfg, dims = session.cfg, session.dims
        self.t_cfg, self.run_dir = cfg.trainer, Path(cfg.run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.optimiser, self.schedule = build_optimiser(session.model, self.t_cfg)
        torch.manual_seed(self.t_cfg.seed + 1 + dims.rank)  # dropout streams differ per rank
        self.rollout = RolloutSchedule.from_config(self.t_cfg.rollout)
        if cfg.evaluate.at_end_of_training:  # fails now, not after training, if it cannot
            evaluation_samples(session, cfg.evaluate.steps, cfg.evaluate.samples)
        self.start = 0
        if self.t_cfg.resume and (self.ckpt_dir / LATEST).exists():
            self.start = restore_training_state(
                self.ckpt_dir / LATEST, cfg, dims, session.model, self.optimiser, self.schedule
            )
            if dims.rank == 0:
                log.info("resuming from step %d of %s", self.start, self.ckpt_dir / LATEST)
        self.last_checkpoint = self.start
        self.hooks = load_hooks(cfg, dims.rank, dims.world)  # debug.hooks: none by default
        self.last_step_s = 0.1
        self.device_memory = PeakDeviceMemory(session.device)
        self.step_fn = train_step(session, self.optimiser, self.schedule)
        self.step_split = StepSplit(session.model, self.start, _profile_after(session), dims.mean_over_world)
        self.val_skill: ValidationSkill | None = None  # built at the first validation (the baselines' scores)

    def nothing_to_do(self) -> str | None:
        """Why this run trains no step (already at ``trainer.stop_at_step`` or ``trainer.steps``)."""
        stop = self.t_cfg.stop_at_step
        if stop is not None and stop <= self.start:
            return f"trainer.stop_at_step = {stop}: the checkpoint in {self.ckpt_dir} is at step {self.start} already"
        if self.start >= self.t_cfg.steps:
            return f"trainer.steps = {self.t_cfg.steps}: the checkpoint in {self.ckpt_dir} is at step {self.start}"
        return None

    def run(self) -> dict[str, Any]:
        """Train from the start step to ``trainer.steps`` (or ``stop_at_step``), then report."""
        dims = self.session.dims
        reason = self.nothing_to_do()
        if reason is not None:
            if dims.rank == 0:
                log.info("%s; nothing to train", reason)
            return {**self.result([], None, None), "reason": reason}
        if dims.rank == 0:
            for partial in remove_partials(self.ckpt_dir):
                log.warning("removed %s, left by a checkpoint write that was interrupted", partial)
        self.tracker = open_tracker(self.session.cfg, dims, self.start)
        skill = None
        try:
            history = self.loop()
            # A stop (trainer.stop_at_step, a signal) is not the end: no final evaluation unless asked.
            if history and (self.stopped is None or self.session.cfg.evaluate.at_stop):
                skill = self.final_report()
        except BaseException as exc:
            self.tracker.finish("FAILED", reason=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.hooks.close()
        self.tracker.finish()
        return self.result(history, self.tracker.run_id, skill)

    def result(self, history: list, run_id: str | None, skill) -> dict[str, Any]:
        """What :func:`train` returns: the loss history, the MLflow run, the steps it started and
        ended at, whether it stopped early (and why), and the skill table when evaluated."""
        end = history[-1][0] + 1 if history else self.start
        return {
            "history": history,
            "run_id": run_id,
            "start_step": self.start,
            "end_step": end,
            "steps": self.t_cfg.steps,
            "stopped": self.stopped,
            "signal": self.stop.signum,  # the signal this rank received, if any
            "skill": skill,
        }

    def loop(self) -> list[tuple[int, dict[str, float]]]:
        history: list[tuple[int, dict[str, float]]] = []
        t_cfg, last_val = self.t_cfg, {"val/loss": float("nan")}
        bar = tqdm(
            total=t_cfg.steps,
            initial=self.start,
            desc="train",
            disable=self.session.dims.rank != 0,
            dynamic_ncols=True,
        )
        try:
            for step in range(self.start, t_cfg.steps):
                with self.step_split.around(step) as profiled:
                    metrics = self.one_step(step)
                metrics |= profiled
                if (step + 1) % t_cfg.val_interval == 0 or step + 1 == t_cfg.steps:
                    metrics.update(self.validate())
                history.append((step, metrics))
                if step % self.session.cfg.logging.log_interval == 0 or "val/loss" in metrics or profiled:
                    self.tracker.log_metrics(step, metrics)
                last_val = {k: v for k, v in metrics.items() if k.startswith("val/")} or last_val
                bar.set_postfix(self.progress(metrics, last_val))
                bar.update()
                more = step + 1 < t_cfg.steps
                if more and t_cfg.stop_at_step is not None and step + 1 >= t_cfg.stop_at_step:
                    self.stopped = "stop_at_step"
                if more and self.stop_agreed:
                    self.stopped = "signal"
                if (step + 1) % t_cfg.checkpoint_interval == 0 or step + 1 == t_cfg.steps or self.stopped:
                    self.checkpoint(step + 1)
                if self.stopped:
                    break
        finally:
            bar.close()
        return history

    def one_step(self, step: int) -> dict[str, float]:
        """One optimiser step; its metrics, summed over the ranks."""
        s, t_cfg = self.session, self.t_cfg
        dims = s.dims
        picks = sample_positions(step, dims.dp_rank, dims.dp, t_cfg.batch_size, len(s.samples.train), t_cfg.seed)
        rollout = self.rollout.steps_at(step)
        t0 = time.perf_counter()
        lr = self.schedule.get_last_lr()[0]
        s.counter.reset()
        self.device_memory.reset()
        batch = s.batches([s.samples.train[i] for i in picks], rollout)
        self.hooks.start_step(step, self.last_step_s)
        x = self.hooks.model_inputs(step, batch.x)
        after_backward = functools.partial(self.hooks.after_backward, step)
        loss = self.step_fn(x, batch.targets, s.grids, s.model_group, s.transport, after_backward, batch.forcings)
        synchronize(s.device)  # the step's time includes the work queued on the GPU
        elapsed = self.last_step_s = time.perf_counter() - t0
        train_loss, peak, sent, stops = dims.sum_over_world(
            [loss.item(), peak_rss() / 2**30, s.counter.total_bytes, float(self.stop.requested)]
        )
        train_loss /= dims.dp
        self.stop_agreed = stops > 0  # a rank was signalled: every rank stops after this step
        device_peak = dims.max_over_world([self.device_memory.peak_gib()])[0]
        if not math.isfinite(train_loss):  # equal on every rank: all stop together
            self.tracker.log_metrics(step, {"train/nonfinite_loss": 1.0})
            raise FloatingPointError(
                f"loss is {train_loss} at step {step}: stopping. The last good checkpoint "
                f"(step {self.last_checkpoint}) is in {self.ckpt_dir}"
            )
        return {
            "train/loss": train_loss,
            "train/rollout": float(rollout),
            "lr": lr,
            "step_time_s": elapsed,
            "samples_per_s": dims.dp * t_cfg.batch_size / elapsed,
            "points_per_s": dims.dp * t_cfg.batch_size * s.dataset.n_points / elapsed,
            "peak_rss_gib_mean_rank": peak / dims.world,  # resident high-water mark so far
            "comm_bytes_per_rank": sent / dims.world,
            **({"peak_device_memory_gib": device_peak} if s.device.type == "cuda" else {}),
        }

    def progress(self, metrics: dict[str, float], last_val: dict[str, float]) -> dict[str, str]:
        """What the progress bar shows after a step: losses, the last validation's RMSE beside
        the best baseline's, samples/s and, on a GPU, the step's peak device memory (the largest
        over the ranks)."""
        shown = {"loss": f"{metrics['train/loss']:.4f}", "val": f"{last_val['val/loss']:.4f}"}
        shown |= self.val_skill.progress(last_val) if self.val_skill is not None else {}
        shown["samples/s"] = f"{metrics['samples_per_s']:.3g}"
        if "peak_device_memory_gib" in metrics:
            shown["gpu_mem"] = f"{metrics['peak_device_memory_gib']:.2f}GiB"
        return shown

    def validate(self) -> dict[str, float]:
        """``val/loss``: the one-step loss on the first ``trainer.val_batches`` batches of
        validation samples, averaged over the replicas; and their RMSE in physical units beside
        the best baseline's (:mod:`training.skill.validation`)."""
        s, t_cfg = self.session, self.t_cfg
        val = s.samples.val[: t_cfg.val_batches * t_cfg.batch_size]
        if self.val_skill is None:
            self.val_skill = ValidationSkill(s, val, variable_units(s.dataset))
        losses = []
        s.model.eval()
        with torch.no_grad(), forward_outputs(s.model) as forecasts:
            for i, b in enumerate(s.batches([v]) for v in val):  # one step: no later forcings
                losses.append(self.step_fn.loss(b.x, b.targets, s.grids, s.model_group, s.transport).item())
                self.val_skill.add(i, forecasts.pop(), b.targets[0])
        s.model.train()
        total = sum(losses) / len(val) * t_cfg.batch_size
        return {"val/loss": s.dims.sum_over_world([total])[0] / s.dims.dp, **self.val_skill.metrics()}

    def checkpoint(self, step: int) -> None:
        """Save the state after ``step`` unless a parameter is not finite (then every rank stops)."""
        s = self.session
        non_finite = sum(not bool(torch.isfinite(p).all()) for p in s.model.parameters())
        # Split parameters differ by rank: agree, so that every rank stops here together.
        if s.dims.sum_over_world([float(non_finite)])[0] > 0:
            raise FloatingPointError(
                f"parameters are not finite after step {step}; not overwriting the last good checkpoint "
                f"(step {self.last_checkpoint}) in {self.ckpt_dir}"
            )
        on_write = self.hooks.checkpoint_write(step)
        save_training_state(
            self.ckpt_dir, step, s.cfg, s.dims, s.model, self.optimiser, self.schedule, on_write, s.transport
        )
        self.last_checkpoint = step

    def final_report(self):
        """Skill by lead time (every rank), then rank 0's table, plots and MLflow artifacts."""
        s = self.session
        dims, ev = s.dims, s.cfg.evaluate
        skill = evaluate_skill(s, ev.steps, ev.samples) if ev.at_end_of_training else None
        if dims.dp_rank == 0:  # replica 0 forecasts one validation date, rank 0 plots it
            part, further = _forecast_part(s)
            parts = [part]
            if dims.mp > 1:
                parts = [None] * dims.mp
                torch.distributed.all_gather_object(parts, part, group=dims.mp_group)
            if dims.rank == 0:
                part = np.concatenate(parts, axis=1)  # the forecast of samples.val[0], one lead on
                sample = s.samples.val[0]
                final_pictures(self.tracker, self.run_dir, s.dataset, part, sample, s.samples.lead, further)
        if skill is not None and dims.rank == 0:
            units = variable_units(s.dataset)
            report_skill(skill, self.run_dir, self.tracker, model_step=self.last_checkpoint, units=units)
        return skill


def _profile_after(session: Session) -> int | None:
    """``logging.profile_after``, or ``None`` where the profiler's CPU split would not say what
    the step computes (a GPU's work is asynchronous; compiled code has no module ranges)."""
    if session.cfg.trainer.compile or session.device.type != "cpu":
        return None
    return session.cfg.logging.profile_after


FURTHER_LEADS_H = (24.0, 48.0)  # the centroid variable's extra map rows


def _forecast_part(session: Session) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """``(2, local points, variables + extra)``: truth and forecast of ``samples.val[0]`` on this
    rank's points one lead on, then ``evaluate.centroid_variable`` at :data:`FURTHER_LEADS_H`
    (the same on every rank: the ones the sample has truth for), and those extras as
    ``(variable, leads)``."""
    dataset, sample = session.dataset, session.samples.val[0]
    name = session.cfg.evaluate.centroid_variable
    lead_h = session.samples.lead * dataset.frequency_s / 3600
    further: list[tuple[str, int]] = []
    if name in dataset.roles.outputs:
        last = dataset.n_times - 1 - sample[0]  # dates of truth after the sample's
        for hours in FURTHER_LEADS_H:
            steps = round(hours / lead_h)
            if steps > 1 and abs(steps * lead_h - hours) < 1e-6 and steps * session.samples.lead <= last:
                further.append((name, steps))
    steps = max([1, *(k for _, k in further)])
    x, targets, forcings = session.batches([sample], steps)
    session.model.eval()
    with torch.no_grad():
        forecasts = rollout(
            session.model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
        )
    session.model.train()
    truth, pred = [targets[0, 0]], [forecasts[0][0]]
    for variable, k in further:
        column = dataset.roles.outputs.index(variable)
        truth.append(targets[k - 1, 0, :, column : column + 1])
        pred.append(forecasts[k - 1][0, :, column : column + 1])
    return np.stack([torch.cat(truth, -1).cpu().numpy(), torch.cat(pred, -1).cpu().numpy()]), further
