"""One layout's steps of a parity check: the training run's own step (:class:`training.loop.step.TrainStep`)
on the training run's batches, with the loss, every gradient and every parameter after the
optimiser step recorded as one rank holding everything has them (split tensors gathered)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from processor.distributed import full_gradients, full_state_dict
from training.config.schema import RunConfig
from training.distributed.parallel import ParallelDims
from training.hooks import load_hooks
from training.loop.step import build_step
from training.loop.trainer import sample_positions
from training.model.rollout import rollout_horizon
from training.session import Session, open_session


class ParityStopped(Exception):
    """A stop signal reached the ranks (agreed by all): the check ends with no verdict."""


@dataclass
class StepRecord:
    """One optimiser step as one rank holding the model sees it, every tensor a CPU copy."""

    loss: float  # the replicas' mean loss (what training logs as train/loss)
    gradients: dict[str, Tensor]  # before clipping: what backward left, summed and averaged over ranks
    parameters: dict[str, Tensor]  # after the optimiser step


def record_steps(
    cfg: RunConfig, dims: ParallelDims, keep: bool, should_stop: Callable[[], bool] = lambda: False
) -> list[StepRecord]:
    """Train ``cfg.parity.steps`` steps of ``cfg`` from its initial parameters on this rank's
    place ``dims``; the records of the steps where ``keep`` (rank 0), else an empty list. Every
    rank of the layout calls (the gathers are collective). The step hooks ``debug.hooks`` names
    may change this rank's inputs (:meth:`training.hooks.StepHook.model_inputs`). After each step,
    :class:`ParityStopped` when ``should_stop()`` (every rank of the world asks, together)."""
    trainer_cfg = cfg.trainer
    session = open_session(cfg, dims, rollout_horizon(trainer_cfg))
    step_fn = build_step(session)
    n_train = len(session.samples.train)
    hooks = load_hooks(cfg, dims.rank, dims.world)
    records = []
    for step in range(cfg.parity.steps):
        picks = sample_positions(step, dims.dp_rank, dims.dp, trainer_cfg.batch_size, n_train, trainer_cfg.seed)
        batch = session.batches([session.samples.train[i] for i in picks], trainer_cfg.rollout.steps_at(step))
        gradients: dict[str, Tensor] = {}
        capture = functools.partial(_gather_gradients, session, gradients, keep)
        x = hooks.model_inputs(step, batch.x)
        loss = step_fn(x, batch.targets, session.grids, session.model_group, session.transport, capture, batch.forcings)
        total = dims.sum_over_world([loss.item()])[0] / dims.dp
        state = full_state_dict(session.model, dims.mp_group, session.transport)  # collective: every rank
        if keep:
            parameters = {name: state[name] for name, _ in session.model.named_parameters()}
            records.append(StepRecord(total, gradients, _cpu_copies(parameters)))
        if should_stop():
            raise ParityStopped(f"stopped after step {step}")
    return records


def _gather_gradients(session: Session, into: dict[str, Tensor], keep: bool) -> None:
    """After backward: every gradient, full (every rank of the layout gathers), copied into
    ``into`` where ``keep``. Copied now: clipping scales the live gradients in place."""
    gradients = full_gradients(session.model, session.dims.mp_group, session.transport)
    if keep:
        into.update(_cpu_copies(gradients))


def _cpu_copies(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Copies on the CPU (a replicated parameter's full tensor is the live one)."""
    return {name: t.detach().to("cpu", torch.float32, copy=True) for name, t in tensors.items()}
