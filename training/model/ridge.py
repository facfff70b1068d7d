"""A ridge regression per grid point, from sums over samples (:class:`RidgeFit`): what the
forecaster's linear baseline (:mod:`training.model.linear_baseline`) and the skill table's
``linear_regression`` (:mod:`training.skill.fitted`) are fitted with."""

from __future__ import annotations

import numpy as np
import torch

RIDGE = 1e-2  # the ridge penalty per fitted sample, on normalised features (not on the constant)


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
        self.gram += x.transpose(1, 2) @ x
        self.cross += x.transpose(1, 2) @ y
        self.count += x.shape[1]

    def solve(self, ridge: float = RIDGE) -> None:
        """The coefficients: ``(X'X + ridge n I') coef = X'y``, the constant not penalised. The
        sums are dropped: on 10^5 points they are hundreds of MB, the coefficients a tenth."""
        if self.gram is None or self.cross is None:
            raise RuntimeError("RidgeFit.solve twice")
        penalty = torch.full((self.gram.shape[-1],), ridge * max(self.count, 1), dtype=torch.float64)
        penalty[-1] = 1e-9 * max(self.count, 1)  # the constant: unpenalised, but never singular
        self.coef = torch.linalg.solve(self.gram + torch.diag(penalty), self.cross)
        self.gram = self.cross = None

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``(points, outputs)`` the prediction from ``features`` ``(points, features)``."""
        if self.coef is None:
            raise RuntimeError("RidgeFit.predict before solve")
        x = self._design(np.asarray(features)[None])  # (points, 1, features + 1)
        return (x @ self.coef)[:, 0].numpy()
