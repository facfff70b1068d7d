"""Autoregressive rollout: the loss weights of its steps, and the forecast loop shared by
training, evaluation and prediction (its length at each step:
:class:`training.config.sections.RolloutConfig`)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from processor.distributed import GroupLike, Transport
from training.config.schema import ConfigValueError, LossConfig, TrainerConfig


def step_weights(steps: int, decay: float = 1.0) -> list[float]:
    """The loss weights of a rollout's ``steps`` forecast steps: ``decay ** k`` for step ``k``
    (from 0), scaled to average 1 (``trainer.rollout.step_decay``; 1: every step alike)."""
    raw = [decay**k for k in range(steps)]
    return [steps * w / sum(raw) for w in raw]


def rollout_horizon(trainer: TrainerConfig) -> int:
    """The most forecast steps one training sample needs (``trainer.rollout.max``)."""
    return max(1, trainer.rollout.max)


def loss_weights(loss: LossConfig, variables: list[str], area_weights: np.ndarray, points: slice) -> Tensor | None:
    """``(local points, variables)`` weights of the squared errors, or None when unweighted,
    for the ``trainer.loss`` section ``loss``; ``area_weights`` ``(points,)`` are the whole
    grid's cell areas with mean 1 (the dataset's), ``points`` this rank's block of them.

    Area weights (``trainer.loss.area_weights``) have mean 1 over the whole grid, and variable
    weights (``trainer.loss.variable_weights``) mean 1 over the variables, so a weighted loss is
    on the scale of the plain mean squared error.
    """
    by_name = dict(loss.variable_weights or {})
    unknown = sorted(set(by_name) - set(variables))
    if unknown:
        raise ConfigValueError(
            f"trainer.loss.variable_weights names {unknown}, which are not among the variables {variables}"
        )
    if any(float(w) < 0 for w in by_name.values()) or (by_name and not any(float(w) > 0 for w in by_name.values())):
        raise ConfigValueError(f"trainer.loss.variable_weights = {by_name}: weights must be >= 0, and not all 0")
    if not loss.area_weights and not by_name:
        return None
    per_variable = np.array([float(by_name.get(v, 1.0)) for v in variables])
    per_variable = per_variable / per_variable.mean()
    per_point = np.asarray(area_weights, dtype=np.float64) if loss.area_weights else np.ones(len(area_weights))
    return torch.from_numpy(np.outer(per_point[points], per_variable).astype(np.float32))


def rollout(
    model: nn.Module,
    x: Tensor,
    steps: int,
    grids: Any,
    group: GroupLike,
    transport: Transport,
    autocast: AbstractContextManager | None = None,
    forcings: Tensor | None = None,
) -> list[Tensor]:
    """``steps`` forecasts from ``x`` ``(batch, local points, inputs)``, each fed the one before:
    a list of ``(batch, local points, outputs)`` tensors (gradients flow through the whole chain
    unless called under ``torch.no_grad``), in ``x``'s dtype.

    Step ``k > 0`` is given the prognostic part of forecast ``k - 1`` (its first
    ``model.num_prognostic`` channels) after the ``model.multistep - 1`` states before it (inputs
    or forecasts), and ``forcings[k - 1]`` ``(batch, local points, forcings)``; ``forcings``
    ``(steps - 1, ...)`` may be None when the model has none."""
    forecaster = _unwrapped(model)
    n, window = forecaster.num_prognostic, forecaster.num_prognostic * getattr(forecaster, "multistep", 1)
    outputs, state, states = [], x, x[..., :window]
    for k in range(steps):
        with autocast or nullcontext():
            output = model(state, grids, group, transport=transport).to(x.dtype)  # autocast may lower it
        outputs.append(output)
        if k + 1 < steps:
            states = torch.cat([states[..., n:], output[..., :n]], dim=-1)  # the oldest out, the forecast in
            given = forcings[k] if forcings is not None and forcings.shape[-1] else None
            state = states if given is None else torch.cat([states, given], dim=-1)
    return outputs


def _unwrapped(model: nn.Module) -> nn.Module:
    """The forecaster inside a data-parallel wrapper (``.module``), or ``model`` itself."""
    while not hasattr(model, "num_prognostic") and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model
