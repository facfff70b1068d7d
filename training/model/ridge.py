"""A ridge regression per grid point, from sums over samples (:class:`RidgeFit`): what the
forecaster's linear baseline (:mod:`training.model.linear_baseline`) and the skill table's
``linear_regression`` (:mod:`training.skill.fitted`) are fitted with."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

RIDGE = 1e-2  # the ridge penalty per fitted sample, on normalised features (not on the constant)
# A fit's sums (X'X and X'y, float64) held at once; a larger grid is fitted a block of points at
# a time, each a pass over the samples (:func:`fit_in_point_blocks`).
MAX_NORMAL_EQUATIONS_BYTES = 2**30


class RidgeFit:
    """A ridge regression per point: ``y (points, outputs) ~ [features, 1] @ coef``, accumulated
    from samples ``(samples, points, features)`` and solved once (:meth:`solve`)."""

    def __init__(self, points: int, features: int, outputs: int) -> None:
        size = features + 1  # and the constant
        self.gram: torch.Tensor | None = torch.zeros(points, size, size, dtype=torch.float64)
        self.cross: torch.Tensor | None = torch.zeros(points, size, outputs, dtype=torch.float64)
        self.count = 0
        self.coef: torch.Tensor | None = None

    @staticmethod
    def _design(features: np.ndarray) -> torch.Tensor:
        """``(points, samples, features + 1)`` the features of ``(samples, points, features)``
        and a constant."""
        x = torch.from_numpy(np.asarray(features, dtype=np.float64)).transpose(0, 1)
        return torch.cat([x, torch.ones(*x.shape[:2], 1, dtype=torch.float64)], dim=-1)

    def add(self, features: np.ndarray, targets: np.ndarray) -> None:
        """Add ``features`` ``(samples, points, features)`` and ``targets`` ``(samples, points,
        outputs)``."""
        if self.gram is None or self.cross is None:
            raise RuntimeError("RidgeFit.add after solve: a solved fit keeps its coefficients alone")
        x = self._design(features)
        y = torch.from_numpy(np.asarray(targets, dtype=np.float64)).transpose(0, 1)
        self.gram.baddbmm_(x.transpose(1, 2), x)  # in place: no product the size of the sums
        self.cross.baddbmm_(x.transpose(1, 2), y)
        self.count += x.shape[1]

    def solve(self, ridge: float = RIDGE) -> None:
        """The coefficients: ``(X'X + ridge n I') coef = X'y``, the constant not penalised. The
        sums are dropped: on 10^5 points they are hundreds of MB, the coefficients a tenth."""
        if self.gram is None or self.cross is None:
            raise RuntimeError("RidgeFit.solve twice")
        penalty = torch.full((self.gram.shape[-1],), ridge * max(self.count, 1), dtype=torch.float64)
        penalty[-1] = 1e-9 * max(self.count, 1)  # the constant: unpenalised, but never singular
        self.gram.diagonal(dim1=-2, dim2=-1).add_(penalty)  # in place: the sums go once solved
        self.coef = torch.linalg.solve(self.gram, self.cross)
        self.gram = self.cross = None

    @classmethod
    def stacked(cls, blocks: list[RidgeFit]) -> RidgeFit:
        """One solved fit of the points of the solved ``blocks``, in their order."""
        if any(block.coef is None for block in blocks):
            raise RuntimeError("RidgeFit.stacked before solve")
        if len(blocks) == 1:
            return blocks[0]
        whole = cls.__new__(cls)
        whole.gram = whole.cross = None
        whole.count = blocks[0].count
        whole.coef = torch.cat([block.coef for block in blocks])  # type: ignore[misc]
        return whole

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(points, outputs)`` the prediction from ``features`` ``(points, features)``."""
        if self.coef is None:
            raise RuntimeError("RidgeFit.predict before solve")
        x = self._design(np.asarray(features)[None])  # (points, 1, features + 1)
        return (x @ self.coef)[:, 0].numpy()


def sums_bytes(points: int, features: int, outputs: int) -> int:
    """Bytes of a :class:`RidgeFit`'s sums for ``points``, ``features`` and ``outputs``."""
    return points * (features + 1) * (features + 1 + outputs) * 8


def fit_in_point_blocks(samples: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]) -> torch.Tensor:
    """``(points, features + 1, outputs)`` float32: the per-point ridge coefficients of the
    ``(features (samples, points, features), targets (samples, points, outputs))`` chunks that
    each call of ``samples`` yields, a block of points at a time whose sums fit in
    :data:`MAX_NORMAL_EQUATIONS_BYTES` (one pass over ``samples()`` a block; one on most grids)."""
    coefs: list[torch.Tensor] = []
    first, points = 0, None
    while points is None or first < points:
        fit, stop = None, first
        for features, targets in samples():
            if fit is None:
                points, n_features, outputs = features.shape[1], features.shape[2], targets.shape[2]
                block = max(1, MAX_NORMAL_EQUATIONS_BYTES // sums_bytes(1, n_features, outputs))
                stop = min(first + block, points)
                fit = RidgeFit(stop - first, n_features, outputs)
            fit.add(features[:, first:stop], targets[:, first:stop])
        if fit is None or fit.count == 0:
            raise ValueError("no training sample to fit the regression on")
        fit.solve()
        coefs.append(fit.coef.float())  # type: ignore[union-attr]
        first = stop
    return torch.cat(coefs)
