"""The model rolled out from evaluation or calibration samples, a few samples at a time (one
rollout for as many as fit in :data:`CHUNK_POINTS` data points): each sample's forecast and
truth at every lead, in physical units. What the skill table (:mod:`training.skill.by_lead`) and
the calibration (:mod:`training.skill.calibration`) score and fit; every rank of a model group
rolls out the same samples."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from training.data.samples import Sample
from training.model.rollout import rollout
from training.session import Session

CHUNK_POINTS = 8192  # rolled out together: as many samples as fit in this many data points (1 to 8)


@dataclass(frozen=True)
class RolledOut:
    """One sample's rollout: ``forecasts`` and ``truths``, per lead ``(local points, outputs)``."""

    sample: Sample
    forecasts: list[np.ndarray]
    truths: list[np.ndarray]


def samples_per_rollout(n_points: int) -> int:
    """How many samples of a grid of ``n_points`` data points are rolled out together: 1 to 8."""
    return max(1, min(8, CHUNK_POINTS // n_points))


def rolled_out(session: Session, samples: list[Sample], steps: int) -> Iterator[RolledOut]:
    """:class:`RolledOut` of each of ``samples`` (in order), ``steps`` leads, by ``session``'s
    model in evaluation mode and without gradients (its mode restored after)."""
    dataset, model = session.dataset, session.model
    chunk, was_training = samples_per_rollout(dataset.n_points), model.training
    model.eval()
    try:
        for first in range(0, len(samples), chunk):
            part = samples[first : first + chunk]
            with torch.no_grad():
                x, targets, forcings = session.batches(part, steps)
                forecasts = rollout(
                    model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
                )
            for i, sample in enumerate(part):
                yield RolledOut(
                    sample,
                    [dataset.denormalise_outputs(forecasts[k][i].cpu().numpy()) for k in range(steps)],
                    [dataset.denormalise_outputs(targets[k, i].cpu().numpy()) for k in range(steps)],
                )
    finally:
        model.train(was_training)
