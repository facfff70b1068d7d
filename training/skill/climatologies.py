"""The climatologies of the training period that the simple baselines forecast with, on one
rank's points: the plain mean, the mean by UTC hour, and, when the training period spans a year,
WeatherBench 2's by day of year and hour (:mod:`training.skill.seasonal`); and the forecasts of
persistence, the climatologies and anomaly persistence (:mod:`training.skill.scores`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from training.data.forcings import utc_hours
from training.data.samples import by_utc_hour, evenly_spread
from training.session import Session
from training.skill.scores import BASELINES, DOY_CLIMATOLOGY, climatology, hourly_climatology
from training.skill.seasonal import SeasonalKey, doy_climatology, seasonal_keys, spans_a_year, window_dates

CLIMATOLOGY_DATES = 365  # training dates a statistic reads (per UTC hour where by hour) at least
# Beyond that floor, every training date while dates x data points stay within POINT_DATES and
# the dates within MAX_DATES, over all UTC hours together: a statistician averages and fits over
# every training date (every store of docs/real-data.md), and a grid of 10^5 points or a decade
# of hourly dates still reads a bounded number (the reads and their Python loops are per date).
POINT_DATES = 2**22
MAX_DATES = 2**13


def date_count(n_points: int, groups: int = 1) -> int:
    """How many training dates (or samples: a date and member) a baseline's statistic reads in
    each of ``groups`` groups (its UTC hours), at most, evenly spread, on a grid of ``n_points``
    data points (the whole grid's: every rank reads the same dates)."""
    total = min(MAX_DATES, POINT_DATES // max(1, n_points))
    return max(CLIMATOLOGY_DATES, total // max(1, groups))


def climatology_dates(session: Session) -> list[int]:
    """Start dates of the training period (at most :func:`date_count`, evenly spread)."""
    dates = sorted({t for t, _ in session.samples.train})
    return evenly_spread(dates, date_count(session.dataset.n_points))


def hourly_climatology_dates(session: Session) -> dict[float, list[int]]:
    """The training period's start dates by UTC hour of the day (at most :func:`date_count` an
    hour, evenly spread): what :func:`training.skill.scores.hourly_climatology` averages."""
    dates = sorted({t for t, _ in session.samples.train})
    when = session.dataset.dates[dates]
    return by_utc_hour(dates, when, date_count(session.dataset.n_points, len(np.unique(utc_hours(when)))))


def doy_climatology_dates(session: Session, targets: Iterable[SeasonalKey]) -> list[int] | None:
    """The training period's start dates in the windows of the ``(day of year, hour)`` targets
    (at most :func:`date_count` an hour, evenly spread): what
    :func:`training.skill.seasonal.doy_climatology` averages; None when the training period
    (its samples' dates and targets) spans less than a year.

    Why a year: the window of a day of year (61 days) must find training dates around it in
    every season scored, and the validation period follows the training period. Shorter, the
    days of year past its end have none, or only the training period's last days; and on a store
    shorter than the window (a month) every window holds every training date of its hour: the
    hourly climatology of fewer dates, nothing to learn from it."""
    dataset = session.dataset
    dates = sorted({t for t, _ in session.samples.train})
    last = dataset.dates[dates[-1]] + np.timedelta64(session.samples.lead * dataset.frequency_s, "s")
    if not spans_a_year(dataset.dates[dates[0]], last, dataset.frequency_s):
        return None
    by_hour = window_dates(dataset.dates, dates, targets)
    count = date_count(dataset.n_points, len(by_hour))
    return sorted(t for ts in by_hour.values() for t in evenly_spread(ts, count))


@dataclass
class Climatologies:
    """The baselines' climatologies of the training period on this rank's points, the model's
    outputs, in physical units: ``plain`` ``(local points, outputs)``, ``hourly`` ``{UTC hour:
    (local points, outputs)}``, ``seasonal`` ``{(day of year, hour): (local points, outputs)}``
    (None: the training period spans less than a year); ``dates``: the dataset's."""

    plain: np.ndarray
    hourly: dict[float, np.ndarray]
    seasonal: dict[SeasonalKey, np.ndarray] | None
    dates: np.ndarray

    @property
    def kinds(self) -> tuple[str, ...]:
        """The baselines scored, in the order of :data:`training.skill.scores.BASELINES`."""
        return tuple(k for k in BASELINES if k != DOY_CLIMATOLOGY or self.seasonal is not None)

    def forecasts(self, initial: np.ndarray, t: int, valid: int) -> dict[str, np.ndarray]:
        """The simple baselines' forecasts ``(local points, outputs)`` from date index ``t``,
        whose state is ``initial``, for date index ``valid``: persistence, climatology, the hourly
        climatology at the valid hour, with ``seasonal`` the climatology by day of year and hour
        at the valid date, and the initial anomaly persisted (from :meth:`anomaly_reference`;
        see :mod:`training.skill.scores`)."""
        hour_v = float(utc_hours(self.dates[[valid]])[0])
        hourly_at_valid = self.hourly.get(hour_v, self.plain)  # an hour no training date has: the plain one
        out = {"persistence": initial, "climatology": self.plain, "hourly_climatology": hourly_at_valid}
        if self.seasonal is not None:
            key_v = seasonal_keys(self.dates[[valid]])[0]
            out[DOY_CLIMATOLOGY] = self.seasonal.get(key_v, hourly_at_valid)  # none in its window: the hourly one
        at_start, at_valid = self.anomaly_reference(t, valid)
        out["anomaly_persistence"] = initial - at_start + at_valid
        return out

    def anomaly_reference(self, t: int, valid: int) -> tuple[np.ndarray, np.ndarray]:
        """The climatologies ``(local points, outputs)`` at date indices ``t`` and ``valid`` that
        an anomaly is taken from: the one by day of year and hour where it has both dates, else
        the hourly one (an hour no training date has: the plain one). Why the seasonal one
        first: its daily cycle is the season's (a summer day's swing, not the year's mean
        swing) and it follows the season over long leads."""
        hour_0, hour_v = (float(h) for h in utc_hours(self.dates[[t, valid]]))
        if self.seasonal is not None:
            key_0, key_v = seasonal_keys(self.dates[[t, valid]])
            if key_0 in self.seasonal and key_v in self.seasonal:
                return self.seasonal[key_0], self.seasonal[key_v]
        return self.hourly.get(hour_0, self.plain), self.hourly.get(hour_v, self.plain)


def training_climatologies(session: Session, dates: Iterable[int]) -> Climatologies:
    """The :class:`Climatologies` of ``session``'s training period on its points; the one by day
    of year for the ``(day of year, hour)`` of the date indices ``dates`` (the initial and valid
    dates to be scored; others are not computed)."""
    dataset, points = session.dataset, session.points
    columns = dataset.roles.output_columns()
    plain = climatology(dataset, climatology_dates(session), points)[:, columns]
    by_hour = hourly_climatology(dataset, hourly_climatology_dates(session), points)
    targets = set(seasonal_keys(dataset.dates[sorted(set(dates))]))
    seasonal_dates = doy_climatology_dates(session, targets)
    seasonal = None
    if seasonal_dates is not None:
        seasonal = doy_climatology(dataset, seasonal_dates, targets, points, columns=columns)
    return Climatologies(plain, {h: c[:, columns] for h, c in by_hour.items()}, seasonal, dataset.dates)
