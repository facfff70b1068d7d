"""Every baseline's definition, worked by hand on tiny stores: persistence, climatology, hourly
climatology, anomaly persistence (from the hourly climatology, or from the one by day of year
when there is one) and WeatherBench 2's climatology by day of year and hour, also checked against
WB2's own computation (years stacked by day of year, wrapped, weighted) on random values."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from training.skill.baselines import fit_samples
from training.skill.climatologies import (
    CLIMATOLOGY_DATES,
    MAX_DATES,
    POINT_DATES,
    Climatologies,
    climatology_dates,
    hourly_climatology_dates,
    training_climatologies,
)
from training.skill.scores import climatology, hourly_climatology
from training.skill.seasonal import days_of_year, doy_climatology, spans_a_year, window_weights
from training.skill.validation import ValidationSkill

MEAN, STDEV = 10.0, 2.0


class FakeStore:
    """One variable ``a`` on the points of ``values`` ``(time, points)`` (physical units, stored
    normalised with mean 10 and stdev 2) at ``dates``."""

    def __init__(self, dates: list[str], values: list[list[float]], missing: tuple[int, ...] = ()) -> None:
        self.dates = np.array(dates, dtype="datetime64[s]")
        self.values = np.asarray(values, dtype=np.float64)
        self.n_points = self.values.shape[1]
        self.missing = frozenset(missing)
        self.frequency_s = int((self.dates[1] - self.dates[0]).astype(np.int64))
        self.area_weights = np.array([1.0, 3.0])[: self.values.shape[1]]
        self.roles = SimpleNamespace(outputs=["a"], output_columns=lambda: [0])

    def state(self, t: int, points: slice = slice(None), member: int = 0) -> np.ndarray:
        assert t not in self.missing
        return ((self.values[t, points] - MEAN) / STDEV)[:, None].astype(np.float32)

    def denormalise(self, x: np.ndarray) -> np.ndarray:
        return x * STDEV + MEAN

    denormalise_outputs = denormalise


class FakeBatches:
    """The model's inputs on ``store``: its normalised state alone (no forcings), lead 1."""

    def __init__(self, store: FakeStore) -> None:
        self.store = store

    def __call__(self, samples: list[tuple[int, int]], steps: int = 1) -> SimpleNamespace:
        x = np.stack([self.store.state(t) for t, _ in samples])
        targets = np.stack([np.stack([self.store.state(t + k) for t, _ in samples]) for k in range(1, steps + 1)])
        return SimpleNamespace(x=torch.from_numpy(x), targets=torch.from_numpy(targets))

    def valid_forcings(self, samples: list[tuple[int, int]], steps: int) -> np.ndarray:
        return np.zeros((steps, len(samples), self.store.values.shape[1], 0))

    def forecast_inputs(self, t: int, member: int, steps: int) -> tuple[torch.Tensor, None]:
        return torch.from_numpy(self.store.state(t)[None]), None


def _session(store: FakeStore, train: list[int]) -> SimpleNamespace:
    """One rank's session over every point of ``store``, training samples from ``train``, lead 1."""
    dims = SimpleNamespace(rank=0, mp_group=None, dp_group=None, dp=1, dp_rank=0)
    return SimpleNamespace(
        cfg=SimpleNamespace(evaluate=SimpleNamespace(area=None)),
        dataset=store,
        points=slice(None),
        dims=dims,
        samples=SimpleNamespace(train=[(t, 0) for t in train], lead=1),
        batches=FakeBatches(store),
    )


# Two days, 12-hourly; trained on dates 0-3, validated from date 4 (00 UTC) to date 5 (12 UTC).
TWO_DAYS = FakeStore(
    ["2021-01-01T00", "2021-01-01T12", "2021-01-02T00", "2021-01-02T12", "2021-01-03T00", "2021-01-03T12"],
    [[2, 10], [6, 20], [4, 14], [8, 24], [5, 11], [9, 22]],
)


def test_climatologies_by_hand_skip_missing_dates():
    store = FakeStore(
        ["2021-01-01T00", "2021-01-01T12", "2021-01-02T00", "2021-01-02T12"],
        [[1, 0], [3, 0], [5, 4], [11, 8]],
        missing=(2,),
    )
    np.testing.assert_array_equal(climatology(store, [0, 1, 2, 3], slice(None)), [[5], [8 / 3]])  # (1 + 3 + 11) / 3
    by_hour = hourly_climatology(store, {0.0: [0, 2], 12.0: [1, 3]}, slice(1, 2))
    np.testing.assert_array_equal(by_hour[0.0], [[0]])  # date 2 missing: date 0 alone
    np.testing.assert_array_equal(by_hour[12.0], [[4]])  # (0 + 8) / 2


def test_every_baseline_by_hand():
    clims = training_climatologies(_session(TWO_DAYS, [0, 1, 2, 3]), [4, 5])
    assert clims.seasonal is None  # two days: no climatology by day of year
    assert clims.kinds == ("persistence", "climatology", "hourly_climatology", "anomaly_persistence")
    np.testing.assert_array_equal(clims.plain, [[5], [17]])  # (2 + 6 + 4 + 8) / 4, (10 + 20 + 14 + 24) / 4
    np.testing.assert_array_equal(clims.hourly[0.0], [[3], [12]])
    np.testing.assert_array_equal(clims.hourly[12.0], [[7], [22]])
    out = clims.forecasts(np.array([[5.0], [11.0]]), 4, 5)
    np.testing.assert_array_equal(out["persistence"], [[5], [11]])
    np.testing.assert_array_equal(out["climatology"], [[5], [17]])
    np.testing.assert_array_equal(out["hourly_climatology"], [[7], [22]])  # the valid hour's: 12 UTC
    np.testing.assert_array_equal(out["anomaly_persistence"], [[5 - 3 + 7], [11 - 12 + 22]])


def test_the_best_baseline_by_hand():
    """Truth (9, 22) at weights (1, 3): errors of persistence (-4, -11), of climatology (-4, -5),
    of the hourly climatology (-2, 0), of anomaly persistence (0, -1).

    Damped persistence: the anomalies from the hourly climatology at dates 0-4 are (-1, -1, 1, 1,
    2) and (-2, -2, 2, 2, -1); the training pairs a day apart give the lag correlations
    3 / sqrt(4 x 7) and 2 / sqrt(16 x 13), and from date 4 the forecasts 7 + 2 rho_0 and
    22 - rho_1: the best."""
    skill = ValidationSkill(_session(TWO_DAYS, [0, 1, 2, 3]), [(4, 0)])
    assert skill.baselines.rmse("persistence", "a") == [pytest.approx(math.sqrt((16 + 3 * 121) / 4))]
    assert skill.baselines.rmse("climatology", "a") == [pytest.approx(math.sqrt((16 + 3 * 25) / 4))]
    assert skill.baselines.rmse("hourly_climatology", "a") == [pytest.approx(1.0)]
    assert skill.baselines.rmse("anomaly_persistence", "a") == [pytest.approx(math.sqrt(3 / 4))]
    rho = 3 / math.sqrt(28), 2 / math.sqrt(208)
    damped = math.sqrt(((7 + 2 * rho[0] - 9) ** 2 + 3 * (22 - rho[1] - 22) ** 2) / 4)
    assert skill.baselines.rmse("damped_persistence", "a") == [pytest.approx(damped)]
    assert math.isfinite(skill.baselines.rmse("linear_regression", "a")[0])
    assert skill.best == {"a": "damped_persistence"}
    assert skill.metrics()["val/rmse/a/best_baseline"] == pytest.approx(damped)


# ---------------------------------------------------------------------------- by day of year


def test_window_weights_are_wb2s():
    w = window_weights(61)
    assert w.shape == (61,) and w[0] == w[-1] == 0 and w.mean() == pytest.approx(1)
    assert w[30] == pytest.approx(61 / 30) and w[15] == pytest.approx(w[30] / 2)
    np.testing.assert_allclose(window_weights(5), [0, 1.25, 2.5, 1.25, 0])  # (0, .5, 1, .5, 0) / 0.4
    with pytest.raises(ValueError, match="odd"):
        window_weights(4)


def test_days_of_year_and_a_year_spanned():
    dates = np.array(["2021-01-01T18", "2021-03-01", "2020-03-01", "2020-12-31"], dtype="datetime64[s]")
    assert days_of_year(dates).tolist() == [1, 60, 61, 366]
    six_hourly = 6 * 3600
    assert spans_a_year(np.datetime64("2021-01-01T00"), np.datetime64("2021-12-31T18"), six_hourly)
    assert not spans_a_year(np.datetime64("2021-01-01T00"), np.datetime64("2021-12-31T12"), six_hourly)


def test_doy_climatology_by_hand():
    """A 5-day window (weights 0, 1.25, 2.5, 1.25, 0 at offsets -2..2)."""
    dates = ["2021-03-01", "2021-03-02", "2022-03-03", "2022-03-04", "2021-03-02T12", "2022-03-05"]
    store = FakeStore(dates, [[1], [2], [4], [100], [50], [7]], missing=(5,))
    # day 61 (2 March), 00 UTC: days 60, 61, 62 at weights 1.25, 2.5, 1.25; day 63 at weight 0;
    # the 12 UTC date is of another hour
    out = doy_climatology(store, list(range(6)), [(61, 0.0), (61, 12.0), (200, 0.0)], slice(None), window=5)
    assert sorted(out) == [(61, 0.0), (61, 12.0)]  # no date in day 200's window
    np.testing.assert_allclose(out[(61, 0.0)], [[(1.25 * 1 + 2.5 * 2 + 1.25 * 4) / 5]], rtol=1e-12)  # 2.25
    np.testing.assert_allclose(out[(61, 12.0)], [[50]], rtol=1e-12)


def test_doy_climatology_wraps_the_year_and_fills_day_366():
    """A common year's 31 December stands at days 365 and 366 (WB2 fills its day 366 with it);
    a leap year's is day 366 only; day 1's window wraps to the end of the year."""
    dates = ["2021-12-31", "2020-12-31", "2022-01-01", "2022-01-02"]
    store = FakeStore(dates, [[2], [6], [4], [8]])
    out = doy_climatology(store, [0, 1, 2, 3], [(1, 0.0), (366, 0.0)], slice(None), window=5)
    # day 1: 2021-12-31 at offset -1 (as day 366; as day 365 at -2: weight 0), 2020-12-31 at -1,
    # 2022-01-01 at 0, 2022-01-02 at +1
    np.testing.assert_allclose(out[(1, 0.0)], [[(1.25 * 2 + 1.25 * 6 + 2.5 * 4 + 1.25 * 8) / 6.25]], rtol=1e-12)  # 4.8
    # day 366: 2021-12-31 at 0 and -1 (2.5 + 1.25), 2020-12-31 at 0, 2022-01-01 at +1, 01-02 at +2
    np.testing.assert_allclose(out[(366, 0.0)], [[(3.75 * 2 + 2.5 * 6 + 1.25 * 4) / 7.5]], rtol=1e-12)


def _two_years() -> tuple[FakeStore, list[int]]:
    """Daily at 00 UTC from 2020-01-01 to 2022-01-03: point 0 is 0 in 2020, 12 in 2021, 20 and 30
    on 1 and 2 January 2022; point 1 is 7. Trained on 2020 and 2021."""
    dates = np.arange(np.datetime64("2020-01-01"), np.datetime64("2022-01-04")).astype("datetime64[s]")
    years = dates.astype("datetime64[Y]").astype(int) + 1970
    point0 = np.where(years == 2020, 0.0, 12.0)
    point0[-3:] = [20, 30, 40]
    store = FakeStore([str(d) for d in dates], np.stack([point0, np.full(len(dates), 7.0)], axis=1).tolist())
    return store, list(range(len(dates) - 3))  # the last training sample's start: 2021-12-31


def test_doy_climatology_of_a_training_period_spanning_years():
    """Days 1 and 2 of the year: each year's window (61 days, weights summing to 61) is whole in
    2020 and 2021 (2021's 31 December filling its day 366), so the climatology is (0 + 12) / 2."""
    store, train = _two_years()
    t = len(store.dates) - 3  # 2022-01-01
    clims = training_climatologies(_session(store, train), [t, t + 1])
    assert clims.kinds == ("persistence", "climatology", "hourly_climatology", "doy_climatology", "anomaly_persistence")
    assert sorted(clims.seasonal) == [(1, 0.0), (2, 0.0)]
    np.testing.assert_allclose(clims.seasonal[(1, 0.0)], [[6], [7]], rtol=1e-12)
    out = clims.forecasts(np.array([[20.0], [7.0]]), t, t + 1)
    np.testing.assert_allclose(out["doy_climatology"], [[6], [7]], rtol=1e-12)
    shorter = training_climatologies(_session(store, train[:300]), [t, t + 1])
    assert shorter.seasonal is None and "doy_climatology" not in shorter.kinds


def test_anomaly_persistence_takes_its_anomaly_from_the_doy_climatology():
    dates = np.array(["2021-06-01T00", "2021-06-02T00", "2021-06-03T00"], dtype="datetime64[s]")
    clim, hourly = np.full((1, 1), 10.0), {0.0: np.full((1, 1), 11.0)}
    seasonal = {(152, 0.0): np.full((1, 1), 20.0), (153, 0.0): np.full((1, 1), 23.0)}  # 1 and 2 June
    initial = np.array([[21.0]])
    out = Climatologies(clim, hourly, seasonal, dates).forecasts(initial, 0, 1)
    np.testing.assert_array_equal(out["doy_climatology"], [[23]])
    np.testing.assert_array_equal(out["anomaly_persistence"], [[21 - 20 + 23]])
    # 3 June has no doy climatology: the hourly one stands in, for both dates of the anomaly
    out = Climatologies(clim, hourly, seasonal, dates).forecasts(initial, 0, 2)
    np.testing.assert_array_equal(out["doy_climatology"], [[11]])
    np.testing.assert_array_equal(out["anomaly_persistence"], [[21 - 11 + 11]])
    assert "doy_climatology" not in Climatologies(clim, hourly, None, dates).forecasts(initial, 0, 1)


def _wb2_stacked(dates: np.ndarray, values: np.ndarray, window: int) -> dict[tuple[int, float], float]:
    """WB2's way (``compute_rolling_stat``): per hour a (year, 366) array of the values (NaN where
    none), a common year's day 366 filled with its day 365, wrapped, then the weighted mean over
    the window and the years of the values present."""
    w, half = window_weights(window), window // 2
    years = dates.astype("datetime64[Y]").astype(int) + 1970
    hours = (dates - dates.astype("datetime64[D]")).astype(int) / 3600
    out = {}
    for hour in np.unique(hours):
        grid = np.full((years.max() - years.min() + 1, 366), np.nan)
        for y, d, v in zip(years[hours == hour], days_of_year(dates[hours == hour]), values[hours == hour]):
            grid[y - years.min(), d - 1] = v
        for i, y in enumerate(range(years.min(), years.max() + 1)):
            if not (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)):
                grid[i, 365] = grid[i, 364]
        padded = np.concatenate([grid[:, -half:], grid, grid[:, :half]], axis=1)
        for doy in range(1, 367):
            win = padded[:, doy - 1 : doy - 1 + window]
            weight = (w * ~np.isnan(win)).sum()
            if weight > 0:
                out[(doy, float(hour))] = float(np.nansum(w * win) / weight)
    return out


def test_doy_climatology_equals_wb2s_stacked_years():
    """Random 12-hourly values over 2.5 years, some dates missing, the second half of a year not
    there at all: the same numbers as WB2's array computation, days 1, 60, 61, 365 and 366 included."""
    rng = np.random.default_rng(4)
    dates = np.arange(np.datetime64("2019-07-01T00"), np.datetime64("2021-12-31T18"), np.timedelta64(12, "h"))
    dates = dates[(dates < np.datetime64("2020-05-01")) | (dates >= np.datetime64("2020-09-01"))].astype(
        "datetime64[s]"
    )
    values = rng.normal(size=len(dates)) * 5 + 280
    missing = tuple(rng.choice(len(dates), 40, replace=False).tolist())
    store = FakeStore([str(d) for d in dates], values[:, None].tolist(), missing=missing)
    store.frequency_s = 12 * 3600
    present = np.ones(len(dates), bool)
    present[list(missing)] = False
    stored = ((values - MEAN) / STDEV).astype(np.float32).astype(np.float64) * STDEV + MEAN  # as the store reads back
    expected = _wb2_stacked(dates[present], stored[present], window=61)
    targets = [(d, h) for d in (1, 2, 59, 60, 61, 150, 200, 300, 365, 366) for h in (0.0, 12.0)]
    out = doy_climatology(store, list(range(len(dates))), targets, slice(None))
    assert sorted(out) == sorted(targets)
    for key in targets:
        assert out[key][0, 0] == pytest.approx(expected[key], rel=1e-12), key


def test_the_fitted_baselines_read_every_training_sample_within_a_budget():
    """A statistician fits on every training date: on a small grid every sample is read, on a
    large one as many as POINT_DATES point-dates allow (CLIMATOLOGY_DATES at least), evenly
    spread over the whole period."""
    train = [(t, 0) for t in range(5000)]  # (date index, member)

    def read(n_points: int, samples: list) -> list:
        session = SimpleNamespace(samples=SimpleNamespace(train=samples), dataset=SimpleNamespace(n_points=n_points))
        return fit_samples(session, 1)

    assert read(561, train) == train  # 5,000 x 561 points: within the budget
    capped = read(4096, train)
    assert len(capped) == POINT_DATES // 4096 == 1024
    assert (capped[0], capped[-1]) == (train[0], train[-1])
    assert len(read(10**6, train)) == CLIMATOLOGY_DATES == 365  # a huge grid: the floor
    assert read(10**6, train[:100]) == train[:100]  # fewer than the floor: every one
    assert len(read(1, [(t, 0) for t in range(20000)])) == MAX_DATES  # a tiny grid: the dates bounded


def test_the_climatologies_average_every_training_date_within_the_budget_over_all_hours():
    """The plain climatology reads as many dates as the fitted baselines; the hourly one shares
    the same budget among its UTC hours (365 an hour at least)."""
    dates = np.arange("2000-01-01T00", 8000 * 6, 6, dtype="datetime64[h]").astype("datetime64[s]")  # 4 hours

    def session(n_points: int) -> SimpleNamespace:
        train = [(t, 0) for t in range(len(dates))]
        dataset = SimpleNamespace(n_points=n_points, dates=dates)
        return SimpleNamespace(samples=SimpleNamespace(train=train), dataset=dataset)

    assert len(climatology_dates(session(561))) == POINT_DATES // 561 == 7476
    by_hour = hourly_climatology_dates(session(512))  # 8,192 dates over 4 hours: all 2,000 of each
    assert sorted(by_hour) == [0.0, 6.0, 12.0, 18.0] and all(len(ts) == 2000 for ts in by_hour.values())
    by_hour = hourly_climatology_dates(session(2048))  # 2,048 dates over 4 hours: 512 of each
    assert all(len(ts) == 512 for ts in by_hour.values())
    by_hour = hourly_climatology_dates(session(10**5))  # the floor, an hour
    assert all(len(ts) == CLIMATOLOGY_DATES for ts in by_hour.values())
