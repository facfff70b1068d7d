"""The climatology by day of year and hour of day, as WeatherBench 2 computes it.

WB2 (``weatherbench2/utils.py``: ``compute_hourly_stat``, ``compute_rolling_stat``,
``create_window_weights``; ``scripts/compute_climatology.py``, ``--window_size=61``) takes, for
each UTC hour ``h`` and day of year ``D`` (1 to 366), the weighted mean over the climatology's
years and a window of days around ``D``:

    c(D, h) = sum_{y, k} w_k x(y, D + k, h) / sum_{y, k present} w_k,    k = -30, ..., 30

- the weights ``w`` decay linearly from 1 at ``D`` to 0 at both ends of the 61-day window,
  scaled to mean 1 (:func:`window_weights`); the window wraps around the year (day 1's window
  holds days 336 to 366);
- a day of year is the calendar's (``dayofyear``: 1 March is day 60 in a common year, 61 in a
  leap year); a common year has no day 366, which WB2 fills with its day 365: a common year's
  31 December counts at days 365 and 366;
- the mean skips what is not there (xarray's weighted mean over missing values): dates missing
  from the store, years not wholly in the period.

Here: ``x`` are the training period's dates (:func:`training.skill.climatologies.doy_climatology_dates`).
Memory: one date is read at a time and added, weighted, to the sums of each ``(day of year,
hour)`` asked for (the targets: the initial and valid dates to be scored) whose window holds it;
nothing is held per date, and no (366 x hours) table: the sums are targets x local points x
variables.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from training.data.forcings import utc_hours

WINDOW_DAYS = 61  # WB2's default window (scripts/compute_climatology.py)
YEAR_SLOTS = 366  # days of year 1..366, a common year's 31 December standing in for its day 366
DAY_S = 86400

SeasonalKey = tuple[int, float]  # (day of year 1..366, UTC hour of the day)


def window_weights(window: int = WINDOW_DAYS) -> np.ndarray:
    """``(window,)`` WB2's weights of the days ``-window // 2, ..., window // 2`` around a day of
    year: rising linearly from 0 to 1 at the centre and falling back to 0, scaled to mean 1."""
    if window < 3 or window % 2 == 0:
        raise ValueError(f"the window must be an odd number of days, 3 or more; got {window}")
    half = window // 2
    weights = np.concatenate([np.linspace(0, 1, half + 1), np.linspace(1, 0, half + 1)[1:]])
    return weights / weights.mean()


def days_of_year(dates: np.ndarray) -> np.ndarray:
    """``(dates,)`` int day of year of each date, 1 on 1 January (``dayofyear``)."""
    days = np.asarray(dates).astype("datetime64[D]")
    return (days - days.astype("datetime64[Y]").astype("datetime64[D]")).astype(np.int64) + 1


def seasonal_keys(dates: np.ndarray) -> list[SeasonalKey]:
    """``(day of year, UTC hour)`` of each date (datetime64)."""
    return [(int(d), float(h)) for d, h in zip(days_of_year(dates), utc_hours(dates))]


def spans_a_year(first: np.datetime64, last: np.datetime64, frequency_s: int) -> bool:
    """Whether dates ``frequency_s`` apart from ``first`` to ``last`` cover a year (365 days)."""
    span_s = (np.datetime64(last, "s") - np.datetime64(first, "s")).astype(np.int64) + frequency_s
    return bool(span_s >= 365 * DAY_S)


def _slots(date: np.datetime64) -> list[int]:
    """The days of year a date stands at: its own, and 366 too for a common year's 31 December."""
    doy = int(days_of_year(np.array([date]))[0])
    year = int(np.datetime64(date, "Y").astype(np.int64)) + 1970
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return [doy, YEAR_SLOTS] if doy == 365 and not leap else [doy]


def window_weight(date: np.datetime64, doys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(len(doys),)`` the weight of ``date`` in the window of each day of year of ``doys`` (0
    outside it), the window wrapping around the 366 days of the year."""
    half, total = len(weights) // 2, np.zeros(len(doys))
    for slot in _slots(date):
        offset = (slot - np.asarray(doys) + YEAR_SLOTS // 2) % YEAR_SLOTS - YEAR_SLOTS // 2
        inside = np.abs(offset) <= half
        total[inside] += weights[offset[inside] + half]
    return total


def _by_hour(targets: Iterable[SeasonalKey]) -> dict[float, np.ndarray]:
    """``{hour: (days of year,)}`` of the targets."""
    by_hour: dict[float, list[int]] = {}
    for doy, hour in sorted(set(targets)):
        by_hour.setdefault(float(hour), []).append(int(doy))
    return {hour: np.array(doys, dtype=np.int64) for hour, doys in by_hour.items()}


def window_dates(
    dates: np.ndarray, candidates: list[int], targets: Iterable[SeasonalKey], window: int = WINDOW_DAYS
) -> dict[float, list[int]]:
    """``{hour: date indices}``: the ``candidates`` (indices into ``dates``) with a weight in the
    window of a target ``(day of year, hour)`` of their hour, in order."""
    weights, by_hour = window_weights(window), _by_hour(targets)
    hours = utc_hours(dates[candidates]) if candidates else []
    found: dict[float, list[int]] = {}
    for t, hour in zip(candidates, hours):
        doys = by_hour.get(float(hour))
        if doys is not None and (window_weight(dates[t], doys, weights) > 0).any():
            found.setdefault(float(hour), []).append(t)
    return found


def doy_climatology(
    dataset: Any,
    dates: list[int],
    targets: Iterable[SeasonalKey],
    points: slice,
    member: int = 0,
    columns: list[int] | None = None,
    window: int = WINDOW_DAYS,
) -> dict[SeasonalKey, np.ndarray]:
    """``{(day of year, hour): (local points, variables)}`` float64 WB2 climatology (see the
    module) in physical units of each target from the date indices ``dates`` (the store's missing
    dates skipped), read one at a time; ``columns``: the variables kept (all when None). A target
    without a weighted date in its window is left out."""
    weights, by_hour = window_weights(window), _by_hour(targets)
    sums: dict[SeasonalKey, np.ndarray] = {}
    totals: dict[SeasonalKey, float] = {}
    for t in dates:
        if t in dataset.missing:
            continue
        date = dataset.dates[t]
        hour = float(utc_hours(np.array([date]))[0])
        doys = by_hour.get(hour, np.zeros(0, dtype=np.int64))
        w_doys = window_weight(date, doys, weights)
        if not (w_doys > 0).any():
            continue
        state = dataset.denormalise(dataset.state(t, points, member).astype(np.float64))
        state = state if columns is None else state[:, columns]
        for doy, w in zip(doys[w_doys > 0].tolist(), w_doys[w_doys > 0].tolist()):
            key = (doy, hour)
            sums[key] = w * state if key not in sums else sums[key] + w * state
            totals[key] = totals.get(key, 0.0) + w
    return {key: sums[key] / totals[key] for key in sorted(sums)}
