"""Forcings: inputs the model is given and never predicts, under anemoi-datasets' names.

Computed from each point's position and each state's date (:data:`COMPUTED`), as
anemoi-datasets' ``forcings`` source computes them (earthkit-data's definitions):

- ``cos_latitude``, ``sin_latitude``, ``cos_longitude``, ``sin_longitude``;
- ``cos_local_time``, ``sin_local_time``: the local solar hour ``(UTC hour + longitude / 15)
  mod 24`` on the circle of 24 h;
- ``cos_julian_day``, ``sin_julian_day``: the day of the year (fractional, from 1 January
  00 UTC) on the circle of 365.25 days;
- ``insolation`` (anemoi's older name of ``cos_solar_zenith_angle``): the cosine of the sun's
  zenith angle, 0 at night, from the solar declination and the equation of time (Spencer 1971,
  good to a few minutes of solar time).

They are in [-1, 1] already and are not normalised. Store variables can be forcings too
(land-sea mask, orography: ``data.forcing``), normalised like every store variable; those the
store records as given (:func:`store_given_fields`) are forcings without being listed; and store
variables can be diagnostic (``data.diagnostic``: outputs only). :class:`VariableRoles` says
which is which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

COMPUTED = (
    "cos_latitude",
    "sin_latitude",
    "cos_longitude",
    "sin_longitude",
    "cos_local_time",
    "sin_local_time",
    "cos_julian_day",
    "sin_julian_day",
    "insolation",
    "cos_solar_zenith_angle",
)
YEAR_DAYS = 365.25
# anemoi's two names of one field: computed under one while the store holds the other, it would be
# given twice.
_SAME_FIELD = {"insolation": "cos_solar_zenith_angle", "cos_solar_zenith_angle": "insolation"}


def day_of_year(dates: np.ndarray) -> np.ndarray:
    """``(dates,)`` days since 1 January 00 UTC of each date's year (fractional; 0 at its start)."""
    dates = np.asarray(dates).astype("datetime64[s]")
    year_start = dates.astype("datetime64[Y]").astype("datetime64[s]")
    return (dates - year_start).astype(np.int64) / 86400.0


def utc_hours(dates: np.ndarray) -> np.ndarray:
    """``(dates,)`` hours since 00 UTC of each date's day (fractional)."""
    dates = np.asarray(dates).astype("datetime64[s]")
    return (dates - dates.astype("datetime64[D]").astype("datetime64[s]")).astype(np.int64) / 3600.0


def local_solar_hours(dates: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """``(dates, points)`` local mean solar time in hours: UTC plus longitude / 15, mod 24."""
    return (utc_hours(dates)[:, None] + np.asarray(longitudes)[None, :] / 15.0) % 24.0


def cos_solar_zenith(dates: np.ndarray, latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """``(dates, points)`` cosine of the sun's zenith angle, clipped at 0 (night)."""
    gamma = 2 * np.pi * day_of_year(dates) / YEAR_DAYS  # the fractional year, radians
    declination = (
        0.006918
        - 0.399912 * np.cos(gamma)
        + 0.070257 * np.sin(gamma)
        - 0.006758 * np.cos(2 * gamma)
        + 0.000907 * np.sin(2 * gamma)
        - 0.002697 * np.cos(3 * gamma)
        + 0.00148 * np.sin(3 * gamma)
    )
    equation_of_time_h = 229.18 / 60 * (
        0.000075 + 0.001868 * np.cos(gamma) - 0.032077 * np.sin(gamma) - 0.014615 * np.cos(2 * gamma)
    ) - 229.18 / 60 * 0.040849 * np.sin(2 * gamma)
    solar_hours = local_solar_hours(dates, longitudes) + equation_of_time_h[:, None]
    hour_angle = np.radians(15.0 * (solar_hours - 12.0))
    lat = np.radians(np.asarray(latitudes))[None, :]
    cosine = np.sin(lat) * np.sin(declination)[:, None] + np.cos(lat) * np.cos(declination)[:, None] * np.cos(
        hour_angle
    )
    return np.clip(cosine, 0.0, None)


def computed_forcings(
    names: tuple[str, ...], dates: np.ndarray, latitudes: np.ndarray, longitudes: np.ndarray
) -> np.ndarray:
    """``(dates, points, len(names))`` float32 forcings :data:`COMPUTED` at ``dates`` for the
    points at ``latitudes``, ``longitudes`` (degrees)."""
    n_dates, n_points = len(dates), len(latitudes)
    lat, lon = np.radians(np.asarray(latitudes)), np.radians(np.asarray(longitudes))
    columns = []
    for name in names:
        trig = np.cos if name.startswith("cos_") else np.sin
        if name.endswith("_latitude"):
            values = np.broadcast_to(trig(lat), (n_dates, n_points))
        elif name.endswith("_longitude"):
            values = np.broadcast_to(trig(lon), (n_dates, n_points))
        elif name.endswith("_local_time"):
            values = trig(2 * np.pi * local_solar_hours(dates, longitudes) / 24.0)
        elif name.endswith("_julian_day"):
            values = np.broadcast_to(trig(2 * np.pi * day_of_year(dates) / YEAR_DAYS)[:, None], (n_dates, n_points))
        elif name in ("insolation", "cos_solar_zenith_angle"):
            values = cos_solar_zenith(dates, latitudes, longitudes)
        else:
            raise ValueError(f"{name!r} is not a computed forcing; they are {', '.join(COMPUTED)}")
        columns.append(values)
    if not columns:
        return np.zeros((n_dates, n_points, 0), np.float32)
    return np.stack(columns, axis=-1).astype(np.float32)


def store_given_fields(
    variables: list[str], constant_fields: Sequence[str] | None, variables_metadata: Mapping[str, Any] | None
) -> tuple[str, ...]:
    """The store variables that are inputs only by the store's own record, as anemoi-datasets
    writes it: its ``constant_fields`` (a land-sea mask, orography) and its computed forcings
    (``variables_metadata[v]["computed_forcing"]``: ``cos_solar_zenith_angle``,
    ``cos_julian_day``, ... from its ``forcings`` source). A store whose record of ``v`` does
    not say (an older anemoi-datasets; none at all) is read by the name, a name of
    :data:`COMPUTED` being a forcing unless the record says where the field came from (``mars``),
    as anemoi-inference reads old metadata. Not a variable to predict, and not one to score."""
    metadata = variables_metadata if isinstance(variables_metadata, Mapping) else {}
    constant = set(constant_fields or ())

    def computed(name: str) -> bool:
        record = metadata.get(name)
        if not isinstance(record, Mapping):
            return name in COMPUTED
        return bool(record.get("computed_forcing", "mars" not in record and name in COMPUTED))

    return tuple(v for v in variables if v in constant or computed(v))


def _store_names(forcing: list[str], variables: list[str]) -> list[str]:
    """``forcing`` with a name the store holds under anemoi's other name of it read as the
    store's (``insolation`` where the store has ``cos_solar_zenith_angle``), given once."""
    named = [_SAME_FIELD[n] if n not in variables and _SAME_FIELD.get(n) in variables else n for n in forcing]
    return list(dict.fromkeys(named))


@dataclass(frozen=True)
class VariableRoles:
    """What each variable is to the model, by name.

    ``prognostic`` (store variables, inputs and outputs), ``forcing`` (store variables, inputs
    only), ``computed`` (:data:`COMPUTED`, inputs only), ``diagnostic`` (store variables,
    outputs only). The model's input channels are ``prognostic + forcing + computed``, its
    outputs ``prognostic + diagnostic``: each block in that order, so the first
    ``len(prognostic)`` channels of both are the state the rollout carries.
    ``columns``: each store variable's column in the dataset's states.
    """

    prognostic: tuple[str, ...]
    forcing: tuple[str, ...]
    computed: tuple[str, ...]
    diagnostic: tuple[str, ...]
    columns: dict[str, int]

    @classmethod
    def build(
        cls,
        variables: list[str],
        forcing: list[str] | None,
        diagnostic: list[str] | None,
        given: tuple[str, ...] = (),
    ) -> VariableRoles:
        """The roles of the dataset's ``variables`` under ``data.forcing`` and ``data.diagnostic``,
        the store's ``given`` fields (:func:`store_given_fields`: its constant fields and computed
        forcings) forcings too, nothing to predict, unless ``data.diagnostic`` names them or they
        are all there is (a store of one repeated field). ``ValueError``
        naming the key for a name that is neither a variable nor computed, a name in both, or no
        prognostic variable left."""
        forcing, diagnostic = list(forcing or []), list(diagnostic or [])
        for key, names in (("data.forcing", forcing), ("data.diagnostic", diagnostic)):
            if len(set(names)) != len(names):
                raise ValueError(f"{key} = {names} names a variable twice")
        forcing = _store_names(forcing, variables)
        unknown = [n for n in forcing if n not in variables and n not in COMPUTED]
        if unknown:
            raise ValueError(
                f"data.forcing names {unknown}: neither dataset variables ({variables}) nor computed forcings "
                f"({', '.join(COMPUTED)})"
            )
        unknown = [n for n in diagnostic if n not in variables]
        if unknown:
            raise ValueError(f"data.diagnostic names {unknown}, which are not dataset variables ({variables})")
        both = sorted(set(forcing) & set(diagnostic))
        if both:
            raise ValueError(f"{both} are in both data.forcing and data.diagnostic: a variable is one or the other")
        inputs_only = [v for v in given if v in variables and v not in forcing and v not in diagnostic]
        if any(v not in forcing + diagnostic + inputs_only for v in variables):  # else nothing is left to predict
            forcing += inputs_only
        prognostic = [v for v in variables if v not in forcing and v not in diagnostic]
        if not prognostic:
            raise ValueError(f"no prognostic variable left in {variables} after data.forcing and data.diagnostic")
        return cls(
            tuple(prognostic),
            tuple(n for n in forcing if n in variables),  # a store variable wins over a computed name
            tuple(n for n in forcing if n not in variables),
            tuple(diagnostic),
            {v: i for i, v in enumerate(variables)},
        )

    @property
    def outputs(self) -> list[str]:
        """The model's output variables: prognostic, then diagnostic."""
        return [*self.prognostic, *self.diagnostic]

    @property
    def inputs(self) -> list[str]:
        """The model's input channels: prognostic, store forcings, computed forcings."""
        return [*self.prognostic, *self.forcing, *self.computed]

    def output_columns(self) -> list[int]:
        return [self.columns[v] for v in self.outputs]

    def forcing_columns(self) -> list[int]:
        return [self.columns[v] for v in self.forcing]

    def prognostic_columns(self) -> list[int]:
        return [self.columns[v] for v in self.prognostic]
