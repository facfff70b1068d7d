"""The climatology of a date as an input (``model.climatology_input``): each prognostic
variable's mean over the training dates of the same UTC hour, per point, normalised like the
states, given to each step with the computed forcings of its dates (:class:`training.data.batches.Batches`).

Why: the hour-of-day climatology is a hard baseline on an hourly store (INCA's humidity: the
model lost to it by 5-8% at the first lead, docs/real-data.md), and a per-point regression on the
states and the sun's hour alone draws the day's cycle as one sine. Given the climatology of the
valid hour, the regression the model learns over (``model.baseline=linear_regression``) weighs
persistence against the climatology per point and lead, as damped persistence does.

Fitted on the training dates only, like the skill table's climatologies
(:mod:`training.skill.climatologies`); a UTC hour the training dates do not have (a store of
another frequency later) gets the mean of every hour.
"""

from __future__ import annotations

import numpy as np

from training.data.dataset import ZarrDataset
from training.data.forcings import utc_hours
from training.data.samples import Sample, by_utc_hour

MEAN_DATES = 365  # training samples averaged per hour, at most (evenly spread)


class HourlyClimatology:
    """``(points, prognostic)`` normalised means by UTC hour, of one rank's block of points."""

    def __init__(self, hours: np.ndarray, means: np.ndarray) -> None:
        self.by_hour = {float(h): m for h, m in zip(hours, means)}  # hour -> (points, prognostic)
        self.overall = means.mean(axis=0)  # for an hour the training dates do not have

    @classmethod
    def fit(cls, dataset: ZarrDataset, points: slice, train: list[Sample]) -> HourlyClimatology:
        """The means of the prognostic variables over the training samples' input dates, by UTC hour."""
        if not train:
            raise ValueError("model.climatology_input: no training sample to average")
        columns = dataset.roles.prognostic_columns()
        by_hour = by_utc_hour(train, dataset.dates[[t for t, _ in train]], MEAN_DATES)
        means = [
            np.mean([dataset.state(t, points, m)[:, columns] for t, m in hour], axis=0) for hour in by_hour.values()
        ]
        return cls(np.array(list(by_hour)), np.stack(means).astype(np.float32))

    @property
    def width(self) -> int:
        """Input channels it adds at a date: one per prognostic variable."""
        return self.overall.shape[-1]

    def at(self, date: np.datetime64) -> np.ndarray:
        """``(points, prognostic)`` the climatology of ``date``'s UTC hour."""
        return self.by_hour.get(float(utc_hours(np.array([date]))[0]), self.overall)
