"""Ridge regressions solved in the dual, over the training samples (``n x n``), for inputs of any
width: every point's inputs at once (:mod:`training.skill.headroom`). Each output variable takes
the kernel and penalty that forecast the last :data:`HOLD_OUT` of the training samples (by date)
best, fitted on the rest; then it is refitted on every sample."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HOLD_OUT = 0.1  # the last tenth of the training samples chooses the penalty
# A linear kernel's penalties, times the mean squared norm of a sample's inputs (the kernel's mean
# diagonal): from nearly none to so much that the fit is nearly zero.
RIDGE_PENALTIES = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4)


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
        return kernel @ self.coef + self.offset


def rbf(sq_distances: np.ndarray, width: float) -> np.ndarray:
    return np.exp(-width * sq_distances)


def squared_distances(gram: np.ndarray, norms_a: np.ndarray, norms_b: np.ndarray) -> np.ndarray:
    """``|a_i - b_j|^2`` from the Gram matrix ``a_i . b_j`` and the squared norms of each side."""
    return np.maximum(norms_a[:, None] + norms_b[None, :] - 2 * gram, 0.0)


@dataclass(frozen=True)
class Choice:
    """A kernel (its key in the kernels offered) and a penalty, chosen for one output variable."""

    key: float | str
    penalty: float


@dataclass(frozen=True)
class PerVariableFit:
    """One :class:`DualFit` per output variable: ``(choice, its target columns, fit)`` each."""

    fits: list[tuple[Choice, np.ndarray, DualFit]]

    @property
    def choices(self) -> list[Choice]:
        return [choice for choice, _, _ in self.fits]

    def predict(self, kernels: dict) -> np.ndarray:
        """``(samples, target columns)`` from each kernel key's ``(samples, training samples)``."""
        first = next(iter(kernels.values()))
        out = np.empty((len(first), sum(len(c) for _, c, _ in self.fits)))
        for choice, columns, fit in self.fits:
            out[:, columns] = fit.predict(kernels[choice.key])
        return out


def choose_and_fit(
    kernels: dict, targets: np.ndarray, penalties: tuple[float, ...], variables: np.ndarray
) -> PerVariableFit:
    """For each output variable (``variables``: the variable index of each target column), the
    kernel and penalty whose fit on the first ``1 - HOLD_OUT`` of the training samples forecasts
    the rest best, refitted on every training sample; ``kernels``: key -> ``(n, n)``."""
    n, count = len(targets), int(variables.max()) + 1
    cut = max(1, min(n - 1, round(n * (1 - HOLD_OUT))))
    errors = {}  # (key, penalty) -> the held-out squared error summed per variable
    for key, kernel in kernels.items():
        for penalty in penalties:
            fit = DualFit.fit(kernel[:cut, :cut], targets[:cut], penalty)
            squared = np.mean((fit.predict(kernel[cut:, :cut]) - targets[cut:]) ** 2, axis=0)
            errors[(key, penalty)] = np.bincount(variables, weights=squared, minlength=count)
    fits = []
    for v in range(count):
        key, penalty = min(errors, key=lambda c, v=v: errors[c][v])
        columns = np.flatnonzero(variables == v)
        fits.append((Choice(key, penalty), columns, DualFit.fit(kernels[key], targets[:, columns], penalty)))
    return PerVariableFit(fits)
