"""The forecaster's linear baseline (``model.baseline=linear_regression``): a ridge regression per
data point of each step's outputs on the step's own inputs (the states, the forcings of the input
and the valid date, normalised), fitted on the training dates before training starts. The
network then learns what the regression leaves, not the whole step, so where it learns nothing
the forecast is the regression's, the statistician's baseline (:mod:`training.skill.fitted`).

The fit is per point, so each rank fits its own block of points: the same numbers as one rank,
no communication. It is not saved in checkpoints: it is fitted again from the store whenever a
session opens (:func:`training.session.open_session`), as the climatologies are."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from training.data.batches import Batches
from training.data.samples import Sample, evenly_spread
from training.data.tendencies import pooled_mean_stdev
from training.model.ridge import fit_in_point_blocks

LINEAR_REGRESSION = "linear_regression"  # model.baseline's value for it
PERSISTENCE = "persistence"  # model.baseline's other value: each step over the latest state
FIT_SAMPLES = 365  # training samples the fit reads, at most (evenly spread)
FIT_CHUNK = 32  # read at a time


class LinearBaseline(nn.Module):
    """``(b, local points, inputs) -> (b, local points, outputs)``: a linear map per point,
    ``coef`` ``(local points, inputs + 1, outputs)`` (the last row: the constant). Holds no
    parameters: nothing of it is trained or saved."""

    def __init__(self, coef: Tensor) -> None:
        super().__init__()
        # A plain tensor, not a buffer: DistributedDataParallel (the gradients' reduction over the
        # model group) copies rank 0's buffers to every rank, and each rank's fit is its own points'.
        self.coef = coef.float()

    def to_device(self, device: torch.device) -> LinearBaseline:
        self.coef = self.coef.to(device)
        return self

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):  # the whole state rides on it: full precision
            return torch.einsum("bpf,pfo->bpo", x.float(), self.coef[:, :-1]) + self.coef[:, -1]


def training_chunks(
    batches: Batches, starts: list[Sample], steps: int
) -> Iterator[tuple[list[Sample], np.ndarray, np.ndarray]]:
    """The samples ``starts``, :data:`FIT_CHUNK` at a time, each chunk with its inputs ``(n,
    points, inputs)`` as the model sees them and its targets ``(steps, n, points, outputs)``, on
    the host: what a fit on the training dates reads (here and :mod:`training.skill.fitted`)."""
    for first in range(0, len(starts), FIT_CHUNK):
        chunk = starts[first : first + FIT_CHUNK]
        batch = batches(chunk, steps)
        yield chunk, batch.x.cpu().numpy(), batch.targets.cpu().numpy()


def residual_statistics(
    baseline: LinearBaseline, batches: Batches, train: list[Sample], prognostic: int, group: dist.ProcessGroup | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, stdev)`` ``(prognostic,)`` of what ``baseline`` leaves of one step's first
    ``prognostic`` outputs (normalised) on the samples it was fitted on, over every point (this
    rank's, summed over ``group``): the scale of what the network learns over it, as the
    increment's statistics are over the latest state (:mod:`training.data.tendencies`)."""
    sums = np.zeros((3, prognostic), dtype=np.float64)  # count, sum, sum of squares
    for _, x, targets in training_chunks(batches, evenly_spread(train, FIT_SAMPLES), 1):
        with torch.no_grad():
            fitted = baseline(torch.from_numpy(x).to(baseline.coef.device)).cpu().numpy()
        left = (targets[0] - fitted)[..., :prognostic].reshape(-1, prognostic).astype(np.float64)
        sums += [np.full(prognostic, len(left)), left.sum(0), (left**2).sum(0)]
    return pooled_mean_stdev(sums, group)


def fit_linear_baseline(batches: Batches, train: list[Sample]) -> LinearBaseline:
    """The ridge fit of one step on up to :data:`FIT_SAMPLES` of the training samples ``train``
    (each with a target a step on), on ``batches``' points, their inputs as the model sees them;
    on a grid whose sums pass :data:`~training.model.ridge.MAX_NORMAL_EQUATIONS_BYTES`, a block of
    points a pass over the samples."""
    starts = evenly_spread(train, FIT_SAMPLES)
    if not starts:
        raise ValueError("model.baseline = linear_regression: no training sample to fit it on")

    def samples() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _, x, targets in training_chunks(batches, starts, 1):
            yield x.astype(np.float64), targets[0]

    return LinearBaseline(fit_in_point_blocks(samples))
