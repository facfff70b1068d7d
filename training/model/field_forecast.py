"""The whole-field forecast the network is given as an input (``model.field_input``): the
per-point linear baseline (:mod:`training.model.linear_baseline`) plus a kernel ridge regression of
what it leaves on **every point's inputs at once**, so that the network sees a forecast that reads the
weather upstream as well as at the point. The network still learns each step over the per-point
baseline; where the field forecast adds nothing, it learns to leave it out.

Fitted in the dual over up to :data:`MAX_FIELD_SAMPLES` training samples
(:mod:`training.model.dual_ridge`), each output variable's kernel (linear, or a Gaussian of one of
three widths: a non-linear forecast) and penalty chosen on the last tenth of them. A map of
thousands of inputs fitted on the very dates the network trains on leaves them a forecast better
than it gives on new dates, and a network trained on it learns to trust it too much (measured:
docs/real-data.md). So the fit is also made **out of fold**: the fitted samples in
:data:`FOLDS` blocks of dates, each block's map fitted on the other blocks; a training step
gives each sample the map of its block (:meth:`FieldForecast.out_of_fold`), validation,
evaluation and forecasts the map of every sample.

Every point on one rank: the map reads the whole grid (``model.field_input`` needs
``trainer.ranks_per_model=1``). Not saved in checkpoints: fitted again whenever a session opens,
as the per-point baseline is."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from training.config.settings import ConfigValueError
from training.data.batches import Batches
from training.data.samples import Sample, evenly_spread
from training.model.dual_ridge import LINEAR, RIDGE_PENALTIES, Choice, DualFit, Kernels, choose_and_fit, field_kernels
from training.model.linear_baseline import LinearBaseline, training_chunks

log = logging.getLogger(__name__)

FOLDS = 5  # blocks of dates for the out-of-fold maps
MAX_FIELD_SAMPLES = 2048  # training samples the fit reads, at most (evenly spread): n x n systems
# Fewer, and a network given a map of thousands of inputs learns the training dates (measured: the
# one-month hourly stores, 613-636 samples, lost up to 25 points at the first lead; docs/real-data.md).
MIN_FIELD_SAMPLES = 1024
# The map is kept where it takes at least this share of the held-out squared error off what the
# per-point regression leaves, for some variable; else it is zero and the forecast the regression's.
MIN_FIELD_GAIN = 0.02
# The fit's samples' inputs and the maps' coefficients, at most: 256 MiB in float32 as the model
# holds them; the fit itself, in float64 with its copies, takes a few times that while it runs.
MAX_FIELD_VALUES = 2**26
# The training samples' own forecasts a run keeps (:meth:`FieldForecast.remember`), at most: 128 MiB.
MAX_REMEMBERED_VALUES = 2**25
REMEMBER_CHUNK = 256  # samples computed at a time: enough rows for the products to be compute-bound


def field_samples_that_fit(points: int, inputs: int, outputs: int, training: int) -> int:
    """How many of ``training`` samples the fit reads on a grid of ``points`` with ``inputs``
    and ``outputs`` a point, within :data:`MAX_FIELD_VALUES` (0: fewer than :data:`MIN_FIELD_SAMPLES`)."""
    per_sample = points * inputs + (FOLDS + 1) * points * outputs
    n = min(training, MAX_FIELD_SAMPLES, MAX_FIELD_VALUES // per_sample)
    return n if n >= MIN_FIELD_SAMPLES else 0


def fold_of(fold_starts: list[int], starts: Sequence[int]) -> list[int]:
    """The fold of each sample's start date index; ``fold_starts``: the first date of folds 1, ..."""
    return [bisect.bisect_right(fold_starts, t) for t in starts]


def date_folds(starts: list[Sample]) -> tuple[list[int], np.ndarray]:
    """``starts`` (in date order) in :data:`FOLDS` blocks of dates, a date's members together:
    the first date index of folds 1, ..., and each sample's fold ``(len(starts),)``."""
    fold_starts = [starts[block[0]][0] for block in np.array_split(np.arange(len(starts)), FOLDS)[1:]]
    return fold_starts, np.array(fold_of(fold_starts, [t for t, _ in starts]))


def standardised_inputs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(kept, mean, scale, standard)`` of samples' inputs ``x (n, inputs)``: the inputs that
    vary (constant ones, as positions, say nothing), their mean and scale, and ``(x[:, kept] -
    mean) / scale``: standardised, then scaled so that a sample's mean squared norm is 1, so that
    the penalties are in units of the kernels' diagonals, 1 for both kinds."""
    mean, stdev = x.mean(axis=0), x.std(axis=0)
    kept = np.flatnonzero(stdev > 1e-6 * max(float(stdev.max()), 1e-30))
    scale = stdev[kept] * np.sqrt(len(kept))
    return kept, mean[kept], scale, (x[:, kept] - mean[kept]) / scale


@dataclass(frozen=True)
class KernelMap:
    """The output columns whose variables chose one kernel (``key``: "linear", or the Gaussian
    kernel's width ``gamma``, exp(-gamma |a - b|^2)): ``coef (FOLDS + 1, n, columns)`` and ``offset
    (FOLDS + 1, columns)``, each fold's map (zero rows for its own block) and, last, every sample's."""

    key: float | str
    columns: Tensor  # (columns,) of the points x outputs
    coef: Tensor
    offset: Tensor

    def to(self, device: torch.device) -> KernelMap:
        """This map on ``device``."""
        return KernelMap(self.key, self.columns.to(device), self.coef.to(device), self.offset.to(device))


class FieldForecast(nn.Module):
    """``(b, points, inputs) -> (b, points, outputs)``: ``per_point(x)`` plus the dual ridge maps
    (:class:`KernelMap`, one per kernel chosen) of every point's standardised inputs (``kept``:
    those that vary; scaled so that a sample's mean squared norm is 1). ``samples (n, kept)``: the
    fitted samples' standardised inputs. Holds no parameters: nothing of it is trained."""

    def __init__(
        self,
        per_point: LinearBaseline,
        standard: tuple[Tensor, Tensor, Tensor],
        samples: Tensor,
        maps: list[KernelMap],
        fold_starts: list[int],
    ) -> None:
        super().__init__()
        self.per_point = per_point
        self.kept, self.mean, self.scale = standard[0], standard[1].float(), standard[2].float()
        self.samples = samples.float()
        self.norms = self.samples.square().sum(dim=1)  # (n,)
        self.maps = [KernelMap(m.key, m.columns, m.coef.float(), m.offset.float()) for m in maps]
        self.fold_starts = fold_starts  # the first date index of folds 1, ..., FOLDS - 1
        self.folds: Tensor | None = None  # (b,) each sample's fold in a training step; None: every sample's map
        self.remembered: Tensor | None = None  # (samples, points, outputs): :meth:`remember`
        self.remembered_rows: dict[Sample, int] = {}
        # A step's given inputs, their version (an edit in place changes it) and their rows of remembered.
        self.step_given: tuple[Tensor, int, Tensor] | None = None

    def to_device(self, device: torch.device) -> FieldForecast:
        self.per_point.to_device(device)
        for name in ("kept", "mean", "scale", "samples", "norms"):
            setattr(self, name, getattr(self, name).to(device))
        self.maps = [m.to(device) for m in self.maps]
        return self

    @contextmanager
    def out_of_fold(self, samples: Sequence[Sample], given: Tensor | None = None) -> Iterator[None]:
        """Within: the batch of training ``samples`` gets each its fold's map. ``given``: their
        inputs ``(b, points, inputs)``; where every sample is remembered, the forecast of this very
        tensor is read from :meth:`remember`'s, not computed (a rollout's later steps, on other
        tensors, are)."""
        self.folds = torch.tensor(fold_of(self.fold_starts, [t for t, _ in samples]), device=self.samples.device)
        rows = [self.remembered_rows.get(sample) for sample in samples] if given is not None else [None]
        if None not in rows:
            self.step_given = (given, given._version, torch.tensor(rows, device=self.samples.device))
        try:
            yield
        finally:
            self.folds, self.step_given = None, None

    def remember(self, batches: Batches, samples: list[Sample]) -> None:
        """Keep the out-of-fold forecast of each of the training ``samples``' own inputs, for the
        training steps given them (:meth:`out_of_fold`). Computed for a step's few samples, the
        product with the fitted samples reads all of them (``samples (n, kept)``, up to 2^26
        values) for a few rows: memory-bound, about a fifth of the step on a 1,325-point box
        (docs/real-data.md). Here in chunks of :data:`REMEMBER_CHUNK`. Nothing is kept where the
        forecasts would pass :data:`MAX_REMEMBERED_VALUES` or no map was kept."""
        points, outputs = self.per_point.coef.shape[0], self.per_point.coef.shape[2]
        if not self.maps:
            return
        if len(samples) * points * outputs > MAX_REMEMBERED_VALUES:
            log.info(
                "field forecast: computed at every step (%d training samples x %d points x %d outputs pass %d values)",
                len(samples),
                points,
                outputs,
                MAX_REMEMBERED_VALUES,
            )
            return
        forecasts = []
        for first in range(0, len(samples), REMEMBER_CHUNK):
            chunk = samples[first : first + REMEMBER_CHUNK]
            with torch.no_grad(), self.out_of_fold(chunk):
                forecasts.append(self(batches(chunk, 1).x.to(self.samples.device)))
        self.remembered = torch.cat(forecasts)
        self.remembered_rows = {sample: row for row, sample in enumerate(samples)}

    def forward(self, x: Tensor) -> Tensor:
        given = self.step_given
        if given is not None and self.remembered is not None and x is given[0] and x._version == given[1]:
            return self.remembered[given[2]]
        b, points, _ = x.shape
        baseline = self.per_point(x)
        if not self.maps:  # the held-out samples found no gain: the regression's forecast
            return baseline
        with torch.autocast(x.device.type, enabled=False):  # the whole state rides on it: full precision
            flat = (x.float().reshape(b, -1)[:, self.kept] - self.mean) / self.scale
            kernels = self._kernels(flat)
            field = flat.new_zeros(b, baseline[0].numel())
            for m in self.maps:
                field[:, m.columns] = self._apply(kernels[m.key], m)
            return baseline + field.reshape(b, points, -1)

    def _kernels(self, flat: Tensor) -> dict[float | str, Tensor]:
        """Each chosen kernel between ``flat (b, kept)`` and the fitted samples: ``(b, n)``."""
        gram = flat @ self.samples.T
        kernels: dict[float | str, Tensor] = {LINEAR: gram}
        gammas = {m.key for m in self.maps} - {LINEAR}
        if gammas:
            distances = (flat.square().sum(dim=1, keepdim=True) + self.norms - 2 * gram).clamp_min(0)
            kernels.update({g: torch.exp(-float(g) * distances) for g in gammas})
        return kernels

    def _apply(self, kernel: Tensor, m: KernelMap) -> Tensor:
        """``(b, columns)``: every sample's map, or in a training step each sample's fold's."""
        if self.folds is None:
            return kernel @ m.coef[-1] + m.offset[-1]
        out = kernel.new_zeros(len(kernel), len(m.columns))
        for k in self.folds.unique().tolist():  # a product per fold in the batch
            rows = (self.folds == k).nonzero().squeeze(1)
            out = out.index_copy(0, rows, kernel[rows] @ m.coef[k] + m.offset[k])
        return out


def _inputs_and_left(batches: Batches, starts: list[Sample], per_point: LinearBaseline) -> tuple[np.ndarray, ...]:
    """Every point's inputs ``(n, points x inputs)`` of ``starts`` and what ``per_point`` leaves
    of their next step ``(n, points, outputs)``, normalised."""
    inputs, left = [], []
    for _, x, targets in training_chunks(batches, starts, 1):
        with torch.no_grad():
            fitted = per_point(torch.from_numpy(x).to(per_point.coef.device)).cpu().numpy()
        inputs.append(x.reshape(len(x), -1))
        left.append(targets[0] - fitted)
    return np.concatenate(inputs).astype(np.float64), np.concatenate(left).astype(np.float64)


def fit_field_forecast(batches: Batches, train: list[Sample], per_point: LinearBaseline) -> FieldForecast:
    """The field maps over ``per_point`` fitted on as many of the one-step training samples
    ``train`` as :func:`field_samples_that_fit` allows (evenly spread), every point on
    ``batches``: each variable's kernel and penalty chosen on their last tenth, then the map of
    every sample and one per fold."""
    points, inputs, outputs = per_point.coef.shape[0], per_point.coef.shape[1] - 1, per_point.coef.shape[2]
    count = field_samples_that_fit(points, inputs, outputs, len(train))
    if count == 0:
        raise ConfigValueError(
            f"model.field_input = true: {len(train)} training samples of {points:,} points x {inputs} inputs: "
            f"fewer than {MIN_FIELD_SAMPLES} (or fewer fit in {MAX_FIELD_VALUES:,} values); set model.field_input=false"
        )
    starts = evenly_spread(train, count)
    x, left = _inputs_and_left(batches, starts, per_point)
    variables = np.tile(np.arange(left.shape[2]), left.shape[1])  # each column's variable, points first
    left = left.reshape(len(left), -1)
    kept, mean, scaled, standard = standardised_inputs(x)
    kernels = field_kernels(standard @ standard.T, np.einsum("ij,ij->i", standard, standard))
    chosen = choose_and_fit(kernels, left, RIDGE_PENALTIES, variables)
    # Blocks of dates (a date's members together): each sample's fold by its date, as in training.
    fold_starts, folds = date_folds(starts)
    gains = [round(100 * float(choice.gain), 1) for choice in chosen.choices]  # by output variable
    keep = max(gains) >= 100 * MIN_FIELD_GAIN
    said = "takes" if keep else "took only: the forecast is the regression's"
    log.info(
        "field forecast: the map of every point's inputs %s %s%% off the regression's held-out error (%s)",
        said,
        gains,
        ", ".join(f"{_kernel_name(c.key)} penalty {c.penalty:g}" for c in chosen.choices),
    )
    maps = _fold_maps(kernels, left, chosen.fits, folds) if keep else []
    as_tensor = torch.from_numpy
    return FieldForecast(
        per_point,
        (as_tensor(kept), as_tensor(mean), as_tensor(scaled)),
        as_tensor(standard),
        maps,
        fold_starts,
    )


def _fold_maps(
    kernels: Kernels, left: np.ndarray, fits: list[tuple[Choice, np.ndarray, DualFit]], folds: np.ndarray
) -> list[KernelMap]:
    """One :class:`KernelMap` per kernel chosen by the variables of ``fits`` (each: its choice, its
    columns of ``left (n, points x outputs)``, its fit on every sample): those fits, and one per
    fold fitted without its block (``folds (n,)``: each sample's fold)."""
    maps = []
    for key in dict.fromkeys(choice.key for choice, _, _ in fits):
        chose_key = [(choice, columns, every) for choice, columns, every in fits if choice.key == key]
        columns = np.concatenate([variable_columns for _, variable_columns, _ in chose_key])
        coef = np.zeros((FOLDS + 1, len(left), len(columns)))
        offset = np.zeros((FOLDS + 1, len(columns)))
        ends = np.cumsum([len(variable_columns) for _, variable_columns, _ in chose_key])
        blocks = [slice(end - len(c), end) for end, (_, c, _) in zip(ends, chose_key)]  # each variable's in the map
        for block, (_, _, every) in zip(blocks, chose_key):
            coef[FOLDS][:, block], offset[FOLDS, block] = every.coef, every.offset
        for k in range(FOLDS):  # the fold's kernel taken once, for every variable that chose it
            rest = np.flatnonzero(folds != k)
            kernel = kernels[key][np.ix_(rest, rest)]
            for block, (choice, variable_columns, _) in zip(blocks, chose_key):
                fit = DualFit.fit(kernel, left[np.ix_(rest, variable_columns)], choice.penalty)
                coef[k][rest, block], offset[k, block] = fit.coef, fit.offset
        maps.append(KernelMap(key, torch.from_numpy(columns), torch.from_numpy(coef), torch.from_numpy(offset)))
    return maps


def _kernel_name(key: float | str) -> str:
    """A kernel's key as the log says it."""
    return key if isinstance(key, str) else f"gaussian gamma {key:.3g}"
