"""One optimisation step of the forecaster (a one-step or rollout loss): the training run's, and
the benchmarks' too.

The model passed in is already parallelised (:meth:`training.distributed.parallel.ParallelDims.parallelize`):
backward leaves the one-rank gradients, summed over the model-parallel ranks and averaged over
data-parallel replicas, so the step is loss, backward, clip, optimiser, schedule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from processor.distributed import GroupLike, Transport, clip_grad_norm_, process_group_of
from training.distributed.device import autocast
from training.loop.flat_adamw import FlatAdamW, FlatParameters, flattenable
from training.model.rollout import loss_weights, rollout, step_weights
from training.session import Session

if TYPE_CHECKING:
    from training.config.schema import TrainerConfig


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimiser(
    model: nn.Module, trainer: TrainerConfig, flat: bool = False
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its warm-up + cosine schedule from the ``trainer`` config section. Fused: one
    kernel for every parameter rather than a handful of ops each (docs/training.md). ``flat``
    (one rank holds the model, nothing else owns its gradients): the parameters moved into one
    flat buffer first, one kernel for the whole model (:mod:`training.loop.flat_adamw`)."""
    params = list(model.parameters())
    if flat and flattenable(params):
        optimiser: torch.optim.Optimizer = FlatAdamW(FlatParameters(params), trainer.lr, trainer.weight_decay)
    else:
        optimiser = torch.optim.AdamW(params, lr=trainer.lr, weight_decay=trainer.weight_decay, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: lr_factor(s, trainer.warmup_steps, trainer.steps, trainer.min_lr_ratio)
    )
    return optimiser, schedule


@dataclass
class TrainStep:
    """Forward (a rollout of one or more steps), loss, backward, clipping, optimiser and
    schedule for one batch on this rank.

    ``points_per_replica``: data points x variables x batch of one replica; each rank's loss
    is its points' share of its replica's (weighted) mean squared error, a mean over the
    rollout's steps weighed by :func:`step_weights` (mean 1), so summed over the model-parallel
    ranks it is the replica's loss.
    ``weights``: ``(local points, variables)`` weights of the squared errors, or None;
    ``step_decay``: a rollout's forecast step ``k`` weighs ``step_decay ** k`` (:func:`step_weights`).
    """

    model: nn.Module  # parallelised: backward reduces the gradients
    optimiser: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    grad_clip: float
    autocast: AbstractContextManager
    points_per_replica: int
    weights: Tensor | None = None
    step_decay: float = 1.0  # trainer.rollout.step_decay: the later forecast steps' weight

    @functools.cached_property
    def clipped(self) -> list[nn.Parameter]:
        """What clipping scales: the optimiser's parameters (the flat one of :class:`FlatAdamW`)."""
        if isinstance(self.optimiser, FlatAdamW):
            return [self.optimiser.flat.param]
        return [p for group in self.optimiser.param_groups for p in group["params"]]

    def loss(
        self, x: Tensor, y: Tensor, grids: Any, group: GroupLike, transport: Transport, forcings: Tensor | None = None
    ) -> Tensor:
        """This rank's share of the replica's loss. ``x`` ``(batch, local points, inputs)``;
        ``y`` ``(batch, local points, outputs)`` for one step, or ``(steps, batch, local points,
        outputs)`` for a rollout in which each forecast is fed the one before (and
        ``forcings[k - 1]`` at step ``k``, see :func:`training.model.rollout.rollout`), gradients
        through all of them."""
        targets = y.unsqueeze(0) if y.dim() == x.dim() else y
        forecasts = rollout(self.model, x, len(targets), grids, group, transport, self.autocast, forcings)
        total = x.new_zeros((), dtype=torch.float32)
        for forecast, target, weight in zip(forecasts, targets, step_weights(len(targets), self.step_decay)):
            squared = (forecast - target).pow(2)
            total = total + weight * (squared if self.weights is None else squared * self.weights).sum()
        return total / (self.points_per_replica * len(targets))

    def __call__(
        self,
        x: Tensor,
        y: Tensor,
        grids: Any,
        group: GroupLike,
        transport: Transport | None = None,
        after_backward: Callable[[], None] | None = None,
        forcings: Tensor | None = None,
    ) -> Tensor:
        """One step on the batch ``x -> y`` (this rank's data points); returns the loss."""
        loss = self.loss(x, y, grids, group, transport or Transport(), forcings)
        loss.backward()
        if after_backward is not None:
            after_backward()
        if self.grad_clip > 0:  # the whole model's norm, also when parameters are split over `group`
            clip_grad_norm_(self.clipped, self.grad_clip, mp_group=process_group_of(group))
        self.optimiser.step()
        self.optimiser.zero_grad(set_to_none=True)
        self.schedule.step()
        return loss.detach()


def build_step(session: Session) -> TrainStep:
    """The step of ``session``'s run: AdamW and its schedule (:func:`build_optimiser`), the model
    parallelised over the ranks (compiled under ``trainer.compile``), the run's clipping,
    precision and loss weights."""
    trainer_cfg, dataset = session.cfg.trainer, session.dataset
    model = session.dims.parallelize(session.model)  # wrapped before the optimiser is built
    optimiser, schedule = build_optimiser(session.model, trainer_cfg, flat=model is session.model)
    outputs = dataset.roles.outputs
    weights = loss_weights(trainer_cfg.loss, outputs, dataset.area_weights, session.points)
    return TrainStep(
        torch.compile(model) if trainer_cfg.compile else model,
        optimiser,
        schedule,
        trainer_cfg.grad_clip,
        autocast(session.device, trainer_cfg.precision),
        trainer_cfg.batch_size * dataset.n_points * len(outputs),  # a replica's points x variables
        None if weights is None else weights.to(session.device),
        trainer_cfg.rollout.step_decay,
    )
