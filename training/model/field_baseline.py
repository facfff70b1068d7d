"""The forecaster's field baseline (``model.baseline=field_regression``): the per-point linear
baseline (:mod:`training.model.linear_baseline`) plus a ridge regression of what it leaves on
every point's inputs at once, so that a step's baseline sees the weather upstream as well as at
the point. Fitted in the dual over the training samples (:mod:`training.model.dual_ridge`), each
output variable's penalty chosen on the last tenth of them, then held as one linear map
``(kept inputs of every point, points x outputs)``. Where the held-out samples find nothing
beyond the per-point fit, the chosen penalty is large and the map near zero.

Every point on one rank: the map reads the whole grid (the derivation picks it only where one
rank holds every point and the map stays within :data:`MAX_FIELD_WEIGHTS`). Not saved in
checkpoints: fitted again whenever a session opens, as the per-point baseline is."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from training.config.settings import ConfigValueError
from training.data.batches import Batches
from training.data.samples import Sample, evenly_spread
from training.model.dual_ridge import RIDGE_PENALTIES, choose_and_fit
from training.model.linear_baseline import LinearBaseline, training_chunks

FIELD_REGRESSION = "field_regression"  # model.baseline's value for it
MAX_FIELD_SAMPLES = 2048  # training samples the fit reads, at most (evenly spread): n x n systems
MAX_FIELD_WEIGHTS = 2**26  # the map's size at most (256 MiB in float32)


class FieldBaseline(nn.Module):
    """``(b, points, inputs) -> (b, points, outputs)``: ``per_point(x)`` plus the field map of
    every point's inputs, standardised (``kept``: the inputs that vary; ``weights (kept, points x
    outputs)``, ``offset (points x outputs,)``). Holds no parameters: nothing of it is trained."""

    def __init__(
        self, per_point: LinearBaseline, kept: Tensor, mean: Tensor, stdev: Tensor, weights: Tensor, offset: Tensor
    ) -> None:
        super().__init__()
        self.per_point = per_point
        self.kept, self.mean, self.stdev = kept, mean.float(), stdev.float()
        self.weights, self.offset = weights.float(), offset.float()

    @property
    def coef(self) -> Tensor:  # the device it is on, as the per-point baseline says it
        return self.per_point.coef

    def to_device(self, device: torch.device) -> FieldBaseline:
        self.per_point.to_device(device)
        for name in ("kept", "mean", "stdev", "weights", "offset"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def forward(self, x: Tensor) -> Tensor:
        b, points, _ = x.shape
        with torch.autocast(x.device.type, enabled=False):  # the whole state rides on it: full precision
            flat = (x.float().reshape(b, -1)[:, self.kept] - self.mean) / self.stdev
            field = (flat @ self.weights + self.offset).reshape(b, points, -1)
        return self.per_point(x) + field


def field_samples(batches: Batches, starts: list[Sample], per_point: LinearBaseline) -> tuple[np.ndarray, np.ndarray]:
    """Every point's inputs ``(n, points x inputs)`` of ``starts`` and what ``per_point`` leaves of
    their next step ``(n, points, outputs)``, normalised."""
    inputs, left = [], []
    for _, x, targets in training_chunks(batches, starts, 1):
        with torch.no_grad():
            fitted = per_point(torch.from_numpy(x).to(per_point.coef.device)).cpu().numpy()
        inputs.append(x.reshape(len(x), -1))
        left.append(targets[0] - fitted)
    return np.concatenate(inputs).astype(np.float64), np.concatenate(left).astype(np.float64)


def fit_field_baseline(batches: Batches, train: list[Sample], per_point: LinearBaseline) -> FieldBaseline:
    """The field map over ``per_point`` fitted on up to :data:`MAX_FIELD_SAMPLES` of the training
    samples ``train`` (one-step samples, every point on ``batches``)."""
    x, left = field_samples(batches, evenly_spread(train, MAX_FIELD_SAMPLES), per_point)
    variables = np.tile(np.arange(left.shape[2]), left.shape[1])  # each column's variable, points first
    left = left.reshape(len(left), -1)
    mean, stdev = x.mean(axis=0), x.std(axis=0)
    kept = np.flatnonzero(stdev > 1e-6 * max(float(stdev.max()), 1e-30))  # constant inputs (positions) say nothing
    if len(kept) * left.shape[1] > MAX_FIELD_WEIGHTS:
        raise ConfigValueError(
            f"model.baseline = {FIELD_REGRESSION}: a map of {len(kept):,} inputs to {left.shape[1]:,} outputs is over "
            f"{MAX_FIELD_WEIGHTS:,} weights: use model.baseline=linear_regression on a grid this size"
        )
    standard = (x[:, kept] - mean[kept]) / stdev[kept]
    gram = standard @ standard.T
    scale = float(np.trace(gram) / len(gram)) or 1.0
    fit = choose_and_fit({"linear": gram}, left, tuple(p * scale for p in RIDGE_PENALTIES), variables)
    coef = np.empty((len(gram), left.shape[1]))
    offset = np.empty(left.shape[1])
    for _, columns, one in fit.fits:
        coef[:, columns], offset[columns] = one.coef, one.offset
    weights = standard.T @ coef  # the dual's k @ coef = x_new . (X' coef)
    as_tensor = torch.from_numpy
    return FieldBaseline(
        per_point, as_tensor(kept), as_tensor(mean[kept]), as_tensor(stdev[kept]), as_tensor(weights), as_tensor(offset)
    )
