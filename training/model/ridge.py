"""A ridge regression per grid point, from sums over samples (:class:`RidgeFit`): what the
forecaster's linear baseline (:mod:`training.model.linear_baseline`) and the skill table's
``linear_regression`` (:mod:`training.skill.fitted`) are fitted with."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

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


class RegressionBlock(NamedTuple):
    """One lead's regression on a block of points, fitted in one pass over the training samples."""

    lead: int  # the lead's index
    first: int  # the block's first point
    stop: int  # and the point after its last

    @property
    def point_slice(self) -> slice:
        return slice(self.first, self.stop)


def regression_groups(points: int, features: int, outputs: int, leads: int) -> list[list[RegressionBlock]]:
    """The regressions fitted together, one pass over the training samples a group, their sums
    within :data:`MAX_NORMAL_EQUATIONS_BYTES`: the leads' points in turn
    (lead 0's, then lead 1's, ...) cut into passes of as many points as fit, so a pass holds
    several whole leads on a small grid and part of one or two on a large one."""
    per_pass = max(1, MAX_NORMAL_EQUATIONS_BYTES // sums_bytes(1, features, outputs))
    groups = []
    for start in range(0, leads * points, per_pass):
        stop = min(start + per_pass, leads * points)
        in_pass = range(start // points, (stop - 1) // points + 1)
        groups.append([RegressionBlock(k, max(start - k * points, 0), min(stop - k * points, points)) for k in in_pass])
    return groups


def fit_in_point_blocks(samples: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]]) -> torch.Tensor:
    """``(points, features + 1, outputs)`` float32: the per-point ridge coefficients of the
    ``(features (samples, points, features), targets (samples, points, outputs))`` chunks that
    each call of ``samples`` yields, a block of points at a time whose sums fit in
    :data:`MAX_NORMAL_EQUATIONS_BYTES` (:func:`regression_groups` of one lead: one pass over
    ``samples()`` a block; one on most grids)."""
    coefs: list[torch.Tensor] = []
    groups: list[list[RegressionBlock]] | None = None
    while groups is None or len(coefs) < len(groups):
        fit, at = None, slice(0)
        for features, targets in samples():
            if fit is None:
                points, n_features, outputs = features.shape[1], features.shape[2], targets.shape[2]
                groups = groups or regression_groups(points, n_features, outputs, leads=1)
                (block,) = groups[len(coefs)]
                at, fit = block.point_slice, RidgeFit(block.stop - block.first, n_features, outputs)
            fit.add(features[:, at], targets[:, at])
        if fit is None or fit.count == 0:
            raise ValueError("no training sample to fit the regression on")
        fit.solve()
        coefs.append(fit.coef.float())  # type: ignore[union-attr]
    return torch.cat(coefs)
