"""climate4R.datasets' R files (``.rda``: R lists of a grid or of stations, and their dates)
written as CF NetCDF that anemoi-datasets' ``netcdf`` source reads; used by
``scripts/real_data.py``. Each writes its NetCDF once, beside the ``.rda``, and returns its path."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

# CORDEX's two files in climate4R.datasets' data/, their MD5s, the store's name for the variable
# and its attributes: (file, md5, variable, attrs). Both on RACMO22E's EUR-44 rotated-pole grid.
CORDEX_FILES = (
    (
        "CORDEX_Iberia_tas.rda",
        "6e32e4e5d32743b22186acc380a030a8",
        "2t",
        {"units": "degC", "standard_name": "air_temperature", "long_name": "daily mean at 2 m"},
    ),
    (
        "CORDEX_Iberia_pr.rda",
        "c0659f9093484efc50c9995431c74b43",
        "tp",
        {"units": "mm", "standard_name": "precipitation_amount", "long_name": "daily total"},
    ),
)

T850_ATTRS = {"units": "K", "standard_name": "air_temperature", "long_name": "daily mean at 850 hPa"}
MSL_ATTRS = {"units": "Pa", "standard_name": "air_pressure_at_mean_sea_level", "long_name": "daily mean"}
# The NCEP Iberia fields on the 2.5 degree grid of ``NCEP_Iberia_ta850.rda`` merged into one store
# (the surface temperature and precipitation files are on another grid, T62's, and stay out).
NCEP_IBERIA_FILES = (
    (
        "NCEP_Iberia_ta850.rda",
        "b2e5491431cafddeb88bdc245b0733e3",
        "t850",
        T850_ATTRS,
    ),
    (
        "NCEP_Iberia_hus850.rda",
        "f899687663b5bb50917c722b56cfb7aa",
        "q850",
        {"units": "kg kg-1", "standard_name": "specific_humidity", "long_name": "daily mean at 850 hPa"},
    ),
    (
        "NCEP_Iberia_psl.rda",
        "3ec5d016d3bc30e6be33d276c232c901",
        "msl",
        MSL_ATTRS,
    ),
)


def climate4r_grid(rda: Path, name: str, attrs: dict) -> Path:
    """The climate4R grid in ``rda`` (an R list: ``Data`` (time, lat, lon), ``xyCoords``,
    ``Dates``) of daily means, written beside it as CF NetCDF (variable ``name`` with ``attrs``)
    for anemoi-datasets' netcdf source."""

    def field(grid: dict, dates):
        import numpy as np
        import xarray as xr

        dims, coords = _latlon_coords(grid["xyCoords"])
        data = np.asarray(grid["Data"], dtype="float32")
        return xr.DataArray(data, dims=("time", *dims), coords={"time": dates, **coords}, attrs=attrs)

    return _netcdf_beside(rda, name, field)


def netcdf_once(out: Path, dataset: Callable) -> Path:
    """``out``: the xarray Dataset ``dataset()`` makes, written as NetCDF unless ``out`` is there
    already, through a ``.part`` file (an interrupted write leaves no ``out``). Every converter
    here and in ``scripts/real_data.py`` writes through it."""
    if not out.exists():
        partial = out.with_suffix(".nc.part")
        dataset().to_netcdf(partial)
        partial.replace(out)
    return out


def _netcdf_beside(rda: Path, name: str, field: Callable) -> Path:
    """``rda``'s climate4R object (its ``Dates``, and the rest as ``field(object, dates)`` makes
    an xarray DataArray of it) written once beside it as CF NetCDF, variable ``name``; its path."""

    def dataset():
        import rdata

        (data,) = rdata.read_rda(str(rda)).values()
        return field(data, _dates(data)).to_dataset(name=name)

    return netcdf_once(rda.with_suffix(".nc"), dataset)


def climate4r_msl(rda: Path) -> Path:
    """NCEP's daily mean sea-level pressure (Pa) of ``NCEP_slp_2001_2010.rda``."""
    return climate4r_grid(rda, "msl", MSL_ATTRS)


def climate4r_t850(rda: Path) -> Path:
    """NCEP's daily mean air temperature at 850 hPa (K) of ``NCEP_Iberia_ta850.rda``."""
    return climate4r_grid(rda, "t850", T850_ATTRS)


def climate4r_eobs_pr(rda: Path) -> Path:
    """E-OBS's daily precipitation (mm) of ``EOBS_Iberia_pr.rda``: NaN over the sea."""
    attrs = {"units": "mm", "standard_name": "precipitation_amount", "long_name": "daily total"}
    return climate4r_grid(rda, "tp", attrs)


def climate4r_eobs_tas(rda: Path) -> Path:
    """E-OBS's daily mean 2 m temperature (degC) of ``EOBS_Iberia_tas.rda``: NaN over the sea."""
    attrs = {"units": "degC", "standard_name": "air_temperature", "long_name": "daily mean at 2 m"}
    return climate4r_grid(rda, "2t", attrs)


def climate4r_stations(rda: Path, name: str, attrs: dict) -> Path:
    """The climate4R station data in ``rda`` (an R list: ``Data`` (time, station), ``xyCoords``
    (station, lon/lat), ``Dates``) of daily means, written beside it as CF NetCDF (variable
    ``name`` with ``attrs`` on a ``values`` dimension, the stations' coordinates on it): a point set."""

    def field(stations: dict, dates):
        import numpy as np
        import xarray as xr

        xy = np.asarray(stations["xyCoords"], dtype="float64")
        return xr.DataArray(
            np.asarray(stations["Data"], dtype="float32"),
            dims=("time", "values"),
            coords={
                "time": dates,
                "latitude": ("values", xy[:, 1], {"units": "degrees_north"}),
                "longitude": ("values", xy[:, 0], {"units": "degrees_east"}),
            },
            attrs=attrs,
        )

    return _netcdf_beside(rda, name, field)


def climate4r_value_tas(rda: Path) -> Path:
    """VALUE's stations' daily mean 2 m temperature (degrees C) of ``VALUE_Iberia_tas.rda``."""
    attrs = {"units": "degC", "standard_name": "air_temperature", "long_name": "daily mean at 2 m"}
    return climate4r_stations(rda, "2t", attrs)


def climate4r_rotated(first: Path) -> Path:
    """CORDEX's climate4R grids (``first`` and the other :data:`CORDEX_FILES` beside it) on a
    rotated-pole grid (``xyCoords``: the rotated ``x``, ``y`` and the true ``lon``, ``lat`` of
    each cell, (y, x)), merged into one CF NetCDF beside them: ``(time, rlat, rlon)``, the
    true latitude and longitude as 2-D coordinates (a curvilinear grid to anemoi-datasets)."""
    return netcdf_once(first.parent / "cordex_iberia.nc", lambda: _merged(first.parent, CORDEX_FILES, _rotated_coords))


def climate4r_ncep_iberia(first: Path) -> Path:
    """The :data:`NCEP_IBERIA_FILES` (``first`` and the others beside it), each a climate4R grid
    on the same dates and regular latitude-longitude axes, merged into one CF NetCDF beside them:
    ``(time, latitude, longitude)``."""
    return netcdf_once(
        first.parent / "ncep_iberia_t_q_msl.nc", lambda: _merged(first.parent, NCEP_IBERIA_FILES, _latlon_coords)
    )


def _merged(folder: Path, files: tuple, coords_of: Callable):
    """The climate4R grids ``files`` ((file, md5, variable, attrs) in ``folder``) as one xarray
    Dataset, each file's ``Data`` its variable on the dimensions and coordinates ``coords_of(xy)``
    gives for the first file's ``xyCoords`` (every file must hold the same dates and ``xyCoords``)."""
    import numpy as np
    import rdata
    import xarray as xr

    fields, dates, xy = {}, None, None
    for file, _, name, attrs in files:
        (grid,) = rdata.read_rda(str(folder / file)).values()
        days = _dates(grid)
        if dates is not None and not (days.equals(dates) and _same_grid(xy, grid["xyCoords"])):
            sys.exit(f"error: {file} is not on {files[0][0]}'s dates and grid")
        dates, xy = days, grid["xyCoords"]
        fields[name] = (np.asarray(grid["Data"], dtype="float32"), attrs)
    dims, coords = coords_of(xy)
    data = {name: xr.DataArray(values, dims=("time", *dims), attrs=attrs) for name, (values, attrs) in fields.items()}
    return xr.Dataset(data, coords={"time": dates, **coords})


def _rotated_coords(xy: dict) -> tuple[tuple[str, str], dict]:
    """A rotated-pole grid's dimensions and coordinates: the rotated axes, and the true latitude
    and longitude of each cell (2-D)."""
    import numpy as np

    return ("rlat", "rlon"), {
        "rlat": ("rlat", np.asarray(xy["y"]), {"standard_name": "grid_latitude", "units": "degrees"}),
        "rlon": ("rlon", np.asarray(xy["x"]), {"standard_name": "grid_longitude", "units": "degrees"}),
        "latitude": (("rlat", "rlon"), np.asarray(xy["lat"]), {"standard_name": "latitude", "units": "degrees_north"}),
        "longitude": (("rlat", "rlon"), np.asarray(xy["lon"]), {"standard_name": "longitude", "units": "degrees_east"}),
    }


def _latlon_coords(xy: dict) -> tuple[tuple[str, str], dict]:
    """A regular latitude-longitude grid's dimensions and coordinates."""
    import numpy as np

    return ("latitude", "longitude"), {
        "latitude": ("latitude", np.asarray(xy["y"]), {"units": "degrees_north"}),
        "longitude": ("longitude", np.asarray(xy["x"]), {"units": "degrees_east"}),
    }


def _dates(data: dict):
    """The days of a climate4R object's ``Dates`` (their start, as ``pandas`` dates)."""
    import numpy as np
    import pandas as pd

    return pd.to_datetime([day.split(" ")[0] for day in np.asarray(data["Dates"]["start"])])


def _same_grid(xy: dict, other: dict) -> bool:
    """Whether two climate4R ``xyCoords`` hold the same axes (``x``, ``y``) and, on a rotated grid,
    the same true coordinates (``lon``, ``lat``)."""
    import numpy as np

    keys = set(xy) | set(other)
    return all(
        key in xy and key in other and np.array_equal(np.asarray(xy[key]), np.asarray(other[key])) for key in keys
    )
