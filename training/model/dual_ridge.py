"""Ridge regressions solved in the dual, over the training samples (``n x n``), for inputs of any
width: every point's inputs at once (the forecaster's :mod:`training.model.field_forecast`, and
:mod:`training.skill.headroom`). Each output variable takes the kernel and penalty that forecast
the last :data:`HOLD_OUT` of the training samples (by date) best, fitted on the rest; then it is
refitted on every sample."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

HOLD_OUT = 0.1  # the last tenth of the training samples chooses the kernel and penalty
MIN_HELD_OUT = 2  # samples
# A linear kernel's penalties, in units of its mean diagonal (the mean squared norm of a sample's
# standardised inputs: their number), which the caller multiplies in, or scales the inputs to 1
# (as the field forecast does, whose Gaussian kernels take the same ones: their diagonal is 1):
# from nearly none to so much that the fit is nearly zero.
RIDGE_PENALTIES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4)
# The Gaussian kernels offered, exp(-gamma |a - b|^2): gamma each of these over the median squared
# distance between the training samples.
KERNEL_GAMMAS = (0.1, 0.3, 1.0)
LINEAR = "linear"  # the linear kernel's key, a . b
Kernels = dict[float | str, np.ndarray]  # a kernel's key (the Gaussian's gamma, or LINEAR) -> the kernel


@dataclass(frozen=True)
class DualFit:
    """A kernel ridge regression fitted in the dual: ``predict(k) = k @ coef + offset`` for the
    kernel ``k (samples, training samples)`` between new samples and the training samples."""

    coef: np.ndarray  # (training samples, outputs)
    offset: np.ndarray  # (outputs,)

    @classmethod
    def fit(cls, kernel: np.ndarray, targets: np.ndarray, penalty: float) -> DualFit:
        """Fit ``targets (n, outputs)`` on the training kernel ``(n, n)`` with ``penalty``."""
        offset = targets.mean(axis=0)
        system = kernel + penalty * np.eye(len(kernel))
        return cls(np.linalg.solve(system, targets - offset), offset)

    def predict(self, kernel: np.ndarray) -> np.ndarray:
        """``(samples, outputs)`` from the kernel ``(samples, training samples)``."""
        return kernel @ self.coef + self.offset


def rbf(sq_distances: np.ndarray, gamma: float) -> np.ndarray:
    """The Gaussian kernel exp(-gamma d) of the squared distances ``d``."""
    return np.exp(-gamma * sq_distances)


def field_kernels(gram: np.ndarray, norms: np.ndarray) -> Kernels:
    """The linear kernel ``gram (n, n)`` of n samples (``norms``: their squared norms) and the
    Gaussian kernels of :data:`KERNEL_GAMMAS` between them, keyed by their gamma."""
    distances = squared_distances(gram, norms, norms)
    median = float(np.median(distances[np.triu_indices(len(gram), 1)])) or 1.0
    return {LINEAR: gram} | {g / median: rbf(distances, g / median) for g in KERNEL_GAMMAS}


def kernels_between(x: np.ndarray, samples: np.ndarray, norms: np.ndarray, keys: Iterable[float | str]) -> Kernels:
    """Each kernel of ``keys`` (:data:`LINEAR`, or a Gaussian's gamma) between the samples ``x (m,
    d)`` and the fitted ``samples (n, d)`` (``norms (n,)``: their squared norms): ``(m, n)``."""
    gram = x @ samples.T
    distances = squared_distances(gram, np.einsum("ij,ij->i", x, x), norms)
    return {key: gram if key == LINEAR else rbf(distances, key) for key in keys}


def squared_distances(gram: np.ndarray, norms_a: np.ndarray, norms_b: np.ndarray) -> np.ndarray:
    """``|a_i - b_j|^2`` from the Gram matrix ``a_i . b_j`` and the squared norms of each side."""
    return np.maximum(norms_a[:, None] + norms_b[None, :] - 2 * gram, 0.0)


@dataclass(frozen=True)
class Choice:
    """A kernel (its key in the kernels offered) and a penalty, chosen for one output variable;
    ``gain``: the share of the held-out squared error it takes off the training samples' mean."""

    key: float | str
    penalty: float
    gain: float = 0.0


@dataclass(frozen=True)
class PerVariableFit:
    """One :class:`DualFit` per output variable: ``(choice, its target columns, fit)`` each."""

    fits: list[tuple[Choice, np.ndarray, DualFit]]

    @property
    def choices(self) -> list[Choice]:
        return [choice for choice, _, _ in self.fits]

    def predict(self, kernels: Kernels) -> np.ndarray:
        """``(samples, target columns)`` from each kernel key's ``(samples, training samples)``."""
        first = next(iter(kernels.values()))
        out = np.empty((len(first), sum(len(c) for _, c, _ in self.fits)))
        for choice, columns, fit in self.fits:
            out[:, columns] = fit.predict(kernels[choice.key])
        return out


def held_out_cut(n: int) -> int:
    """How many of ``n`` training samples (in date order) fit; the rest choose the kernel and penalty."""
    cut = round(n * (1 - HOLD_OUT))
    if n - cut < MIN_HELD_OUT or cut < MIN_HELD_OUT:
        raise ValueError(f"{n} training samples: too few to choose a penalty on the last tenth of them")
    return cut


@dataclass(frozen=True)
class HeldOutSpectrum:
    """One kernel on the first ``cut`` training samples, eigendecomposed (``values (cut,)``,
    ``vectors (cut, cut)``), and ``across (n - cut, cut)``: the kernel between the held-out samples
    and those, in the eigenvectors' basis. ``(K + p I)^-1 = V (L + p)^-1 V'`` then serves every
    penalty ``p`` and every target: 0.4 of the time of a solve per penalty at the eight penalties
    (1,843 samples, 561 targets, measured on a 2-core Zen 4), and a fit of several leads on the
    same samples decomposes each kernel once."""

    cut: int
    values: np.ndarray
    vectors: np.ndarray
    across: np.ndarray

    @classmethod
    def of(cls, kernel: np.ndarray, cut: int) -> HeldOutSpectrum:
        """The spectrum of ``kernel (n, n)`` fitted on its first ``cut`` samples."""
        values, vectors = np.linalg.eigh(kernel[:cut, :cut])
        # a kernel is positive semi-definite: an eigenvalue below 0 is rounding
        return cls(cut, np.maximum(values, 0.0), vectors, kernel[cut:, :cut] @ vectors)

    def forecasts(self, targets: np.ndarray, penalties: tuple[float, ...]) -> Iterator[np.ndarray]:
        """For each of ``penalties``, ``(n - cut, outputs)``: the held-out samples' forecasts by the
        :class:`DualFit` of ``targets[:cut]`` (``targets (n, outputs)``)."""
        offset = targets[: self.cut].mean(axis=0)
        projected = self.vectors.T @ (targets[: self.cut] - offset)  # (cut, outputs)
        for penalty in penalties:
            yield self.across @ (projected / (self.values + penalty)[:, None]) + offset


def held_out_spectra(kernels: Kernels) -> dict[float | str, HeldOutSpectrum]:
    """Each kernel's :class:`HeldOutSpectrum`, its last :data:`HOLD_OUT` of samples held out."""
    return {key: HeldOutSpectrum.of(kernel, held_out_cut(len(kernel))) for key, kernel in kernels.items()}


def choose_and_fit(
    kernels: Kernels,
    targets: np.ndarray,
    penalties: tuple[float, ...],
    variables: np.ndarray,
    weights: np.ndarray | None = None,
    spectra: dict[float | str, HeldOutSpectrum] | None = None,
) -> PerVariableFit:
    """For each output variable (``variables``: the variable index of each target column), the
    kernel and penalty whose fit on the first ``1 - HOLD_OUT`` of the training samples (in date
    order) forecasts the rest best, by the squared error weighed per column (``weights``, e.g. the
    points' areas; None: equal), refitted on every training sample; ``kernels``: key -> ``(n, n)``;
    ``spectra``: their :func:`held_out_spectra`, where a caller fits several targets (None: each
    decomposed here in turn, one held at a time)."""
    n, count = len(targets), int(variables.max()) + 1
    cut = held_out_cut(n)
    column_weights = np.ones(targets.shape[1]) if weights is None else weights
    errors = {}  # (key, penalty) -> the held-out squared error summed per variable
    squared = np.mean((targets[:cut].mean(axis=0) - targets[cut:]) ** 2, axis=0)
    none = np.bincount(variables, weights=squared * column_weights, minlength=count)  # no fit: the mean
    for key in kernels:
        spectrum = HeldOutSpectrum.of(kernels[key], cut) if spectra is None else spectra[key]
        if spectrum.cut != cut or len(spectrum.across) != n - cut:
            raise ValueError(f"a spectrum of {spectrum.cut} + {len(spectrum.across)} samples for {n} targets")
        for penalty, held_out in zip(penalties, spectrum.forecasts(targets, penalties), strict=True):
            squared = np.mean((held_out - targets[cut:]) ** 2, axis=0)
            errors[(key, penalty)] = np.bincount(variables, weights=squared * column_weights, minlength=count)
    fits = []
    for v in range(count):
        key, penalty = min(errors, key=lambda c, v=v: errors[c][v])
        columns = np.flatnonzero(variables == v)
        gain = 1 - errors[(key, penalty)][v] / none[v] if none[v] > 0 else 0.0
        fits.append((Choice(key, penalty, gain), columns, DualFit.fit(kernels[key], targets[:, columns], penalty)))
    return PerVariableFit(fits)
