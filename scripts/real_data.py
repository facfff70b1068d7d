"""Fetch small public samples of real data (reanalyses, observations, a climate model) and build
anemoi-datasets stores from them.

    .venv-anemoi/bin/python scripts/real_data.py era5_uk_2t        # -> data/real/era5_uk_2t.zarr
    .venv-anemoi/bin/python scripts/real_data.py --list
    .venv-anemoi/bin/python scripts/real_data.py --test-sample     # rebuilds tests/data/'s sample

Each source file is downloaded once into ``data/real/`` (git-ignored), checked against its
published MD5, and turned into a store by ``anemoi-datasets create`` from a recipe written
beside it: the store is anemoi's own, never written by hand. Runs in ``.venv-anemoi``
(``bash scripts/setup_anemoi.sh``), which has anemoi-datasets and ecCodes.

The sources (see docs/real-data.md for what each holds and the skill a model reaches on it):

- ``era5_uk_2t``: ERA5 2 m temperature, hourly, March 2019, a 0.25 degree box over the British
  Isles (33 x 49 points), from pydata/xarray-data (xarray's tutorial data; contains modified
  Copernicus Climate Change Service information 2019).
- ``inca_graz``: GeoSphere Austria's (ZAMG's) INCA analysis, hourly, May 2012, 2 m temperature,
  mean sea-level pressure and relative humidity on its 1 km Lambert grid near Graz (17 x 20
  points), from pyet-org/pyet's examples.
- ``ncep_msl_daily``: the NCEP/NCAR Reanalysis 1's daily mean sea-level pressure, 2001-2010
  (3652 days), 2.5 degrees over the North Atlantic and Europe (17 x 33 points, 30-70 N, 70 W-10
  E), from SantanderMetGroup/climate4R.datasets (an R file, made CF NetCDF by ``scripts/climate4r.py``).
- ``ncep_iberia_t850``: the NCEP/NCAR Reanalysis 1's daily mean 850 hPa temperature over Iberia,
  20 winters (December to February, 1982/83 to 2001/02: 1805 days, the rest of each year recorded
  as missing dates), 2.5 degrees (5 x 7 points, 35-45 N, 10 W-5 E), from the same repository.
- ``ncep_iberia_t_q_msl``: the same reanalysis, winters and grid with three fields: 850 hPa
  temperature and specific humidity, and mean sea-level pressure (three files, merged here into
  one NetCDF).
- ``eobs_iberia_pr``, ``eobs_iberia_2t``: E-OBS's daily precipitation and daily mean 2 m
  temperature over Iberia, the same 20 winters, 0.5 degrees (19 x 29 points, 35-44 N, 10 W-4 E),
  land only (the sea NaN, built with anemoi-datasets' ``build.allow_nans``), the same repository.
- ``value_iberia_2t``: the VALUE project's 11 Iberian stations (ECA&D), daily mean 2 m
  temperature, the same 20 winters: a point set with gaps, from the same repository.
- ``cordex_iberia``: a regional climate model's daily mean 2 m temperature and precipitation
  (CORDEX EUR-44: KNMI's RACMO22E driven by EC-EARTH's historical run), the same 20 winters, on
  its 0.44 degree rotated-pole grid (28 x 30 points, a curvilinear grid in true latitude and
  longitude), from the same repository (two files, merged here into one NetCDF).
- ``wfde5_uk_land``: WFDE5 (the WATCH forcing methodology applied to ERA5), hourly, January 2017,
  six near-surface variables (air temperature, specific humidity, wind speed, precipitation,
  downwelling short- and longwave radiation), 0.5 degrees over the British Isles (20 x 28
  points), land only (NaN over the sea), from unifhy-org/unifhy's example data (six files, one a
  variable, merged here into one NetCDF).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from climate4r import (  # scripts/, beside this file
    CORDEX_FILES,
    NCEP_IBERIA_FILES,
    climate4r_eobs_pr,
    climate4r_eobs_tas,
    climate4r_msl,
    climate4r_ncep_iberia,
    climate4r_rotated,
    climate4r_t850,
    climate4r_value_tas,
    netcdf_once,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "real"
TEST_SAMPLE = ROOT / "tests" / "data" / "era5_uk_2t_2019-03_6h.grib"
XARRAY_DATA = "https://github.com/pydata/xarray-data/raw/5b1bd4040d04f355446ea7f3d55ab3ca348512fa"
PYET = "https://github.com/pyet-org/pyet/raw/2e857fe5dcc7cfe8d1ef990156dd6f153769de7b"
CLIMATE4R = "https://github.com/SantanderMetGroup/climate4R.datasets/raw/ba034fb48a6ec7544d7f96f1d3fbe3d673828404"
UNIFHY = "https://github.com/unifhy-org/unifhy/raw/487da4e70cb869e8a5a1bbc47750b439ab4afbc3"
# WFDE5's files in unifhy's data/, their MD5s, and each one's variable: (file, md5, variable).
WFDE5_FILES = (
    ("air_temperature.nc", "dab41460fe520492714dcf46e5a058f2", "Tair"),
    ("specific_humidity.nc", "8fc65507f68f35b721457f3a64e54437", "Qair"),
    ("wind_speed.nc", "c4272907ac497dc6c4d32ce2fc0ee8f5", "Wind"),
    ("precipitation_flux.nc", "ae062c0e4c417a0db0d9d43ee6d3953a", "pr"),
    ("surface_downwelling_shortwave_flux_in_air.nc", "81d2f561a384c05460ea43cea68d50c0", "SWdown"),
    ("surface_downwelling_longwave_flux_in_air.nc", "186716f157d16997d9267667502b3ad9", "LWdown"),
)


def wfde5_merged(first: Path) -> Path:
    """WFDE5's six files (``first`` and the others beside it) merged into one CF NetCDF beside
    them, one variable each, on ``latitude``/``longitude``; written once."""

    def merged():
        import xarray as xr

        fields = []
        for file, _, variable in WFDE5_FILES:
            with xr.open_dataset(first.parent / file) as ds:
                fields.append(ds[[variable]].load())
        both = xr.merge(fields, join="exact").rename({"lat": "latitude", "lon": "longitude"})
        both["latitude"].attrs["units"] = "degrees_north"
        both["longitude"].attrs["units"] = "degrees_east"
        return both

    return netcdf_once(first.parent / "wfde5_uk_2017-01.nc", merged)


def winter_gaps(first: str, last: str) -> list[str]:
    """The days from ``first`` to ``last`` (ISO dates) outside December to February: the dates a
    store of winters records as missing."""
    import pandas as pd

    days = pd.date_range(first, last, freq="1D")
    return [d.strftime("%Y-%m-%dT00:00:00") for d in days if d.month not in (12, 1, 2)]


@dataclass(frozen=True)
class Source:
    """A public file of real data and the recipe's input section for it."""

    url: str
    md5: str
    description: str
    dates: tuple[str, str, str]  # start, end, frequency of the store
    source: str  # anemoi-datasets' source: grib, netcdf, xarray
    select: dict  # the source's selection (param, variable, ...)
    convert: Callable[[Path], Path] | None = None  # the downloaded file -> one anemoi-datasets reads
    missing: tuple[str, ...] = ()  # dates in the range that the file does not hold
    allow_nans: bool = False  # points with no value (a land-only product's sea): anemoi's build.allow_nans
    companions: tuple[tuple[str, str], ...] = ()  # more files (url, md5) that convert reads beside the first


def iberia_winters(
    files: tuple[tuple[str, str], ...], description: str, params: list[str], convert: Callable, nans: bool = True
) -> Source:
    """climate4R files ``(name, md5)`` of the 20 Iberian winters (DJF 1982/83-2001/02, daily; the
    rest of each year missing dates), the first the source's and the rest its companions; with
    ``nans``, points without a value (the sea of a land-only product)."""
    (file, md5), *companions = files
    return Source(
        f"{CLIMATE4R}/data/{file}",
        md5,
        f"{description}, 20 winters (DJF 1982/83-2001/02)",
        ("1982-12-01T00:00:00", "2002-02-28T00:00:00", "1d"),
        "netcdf",
        {"param": params},
        convert,
        tuple(winter_gaps("1982-12-01", "2002-02-28")),
        allow_nans=nans,
        companions=tuple((f"{CLIMATE4R}/data/{name}", digest) for name, digest in companions),
    )


def merged_winters(files: tuple, description: str, convert: Callable) -> Source:
    """:func:`iberia_winters` of climate4R ``files`` ((name, md5, variable, attrs), one variable a
    file, no point without a value) that ``convert`` merges into one NetCDF."""
    return iberia_winters(
        tuple((file, md5) for file, md5, _, _ in files),
        description,
        [variable for _, _, variable, _ in files],
        convert,
        nans=False,
    )


SOURCES = {
    "era5_uk_2t": Source(
        f"{XARRAY_DATA}/era5-2mt-2019-03-uk.grib",
        "eae4f0d198f4f6c16ba950975a217155",
        "ERA5 2 m temperature, hourly, 2019-03, 0.25 deg box over the British Isles (33 x 49)",
        ("2019-03-01T00:00:00", "2019-03-31T23:00:00", "1h"),
        "grib",
        {"param": ["2t"]},
    ),
    "inca_graz": Source(
        f"{PYET}/docs/examples/data/example_2/incal_hourly_20120501T0000_20120930T2300.nc",
        "244860183dbbaafffd94a641580e6e73",
        "INCA analysis (GeoSphere Austria), hourly, 2012-05, T2M, P0, RH2M on 1 km Lambert near Graz (17 x 20)",
        ("2012-05-01T00:00:00", "2012-05-31T23:00:00", "1h"),
        "netcdf",
        {"param": ["T2M", "P0", "RH2M"]},
    ),
    "ncep_msl_daily": Source(
        f"{CLIMATE4R}/data/NCEP_slp_2001_2010.rda",
        "3d82071b7186de9bfe8132a41897e2d8",
        "NCEP/NCAR Reanalysis 1, daily mean sea-level pressure, 2001-2010, 2.5 deg, North Atlantic-Europe (17 x 33)",
        ("2001-01-01T00:00:00", "2010-12-31T00:00:00", "1d"),
        "netcdf",
        {"param": ["msl"]},
        climate4r_msl,
    ),
    "ncep_iberia_t850": iberia_winters(
        (NCEP_IBERIA_FILES[0][:2],),  # the temperature's file alone
        "NCEP/NCAR Reanalysis 1, daily mean 850 hPa temperature, 2.5 deg, Iberia (5 x 7)",
        ["t850"],
        climate4r_t850,
        nans=False,
    ),
    "ncep_iberia_t_q_msl": merged_winters(
        NCEP_IBERIA_FILES,
        "NCEP/NCAR Reanalysis 1, daily mean 850 hPa temperature and specific humidity and mean sea-level "
        "pressure, 2.5 deg, Iberia (5 x 7)",
        climate4r_ncep_iberia,
    ),
    "eobs_iberia_pr": iberia_winters(
        (("EOBS_Iberia_pr.rda", "87093172c60e95765cf127d9d05f35cd"),),
        "E-OBS daily precipitation, 0.5 deg, Iberia (19 x 29; land only: the sea has no value)",
        ["tp"],
        climate4r_eobs_pr,
    ),
    "eobs_iberia_2t": iberia_winters(
        (("EOBS_Iberia_tas.rda", "01c9a8c2fd4e05de00f515107989f3f4"),),
        "E-OBS daily mean 2 m temperature, 0.5 deg, Iberia (19 x 29; land only: the sea has no value)",
        ["2t"],
        climate4r_eobs_tas,
    ),
    "value_iberia_2t": iberia_winters(
        (("VALUE_Iberia_tas.rda", "8da27da509229a53d33780b985d8244e"),),
        "VALUE's 11 Iberian stations (ECA&D), daily mean 2 m temperature: a point set, 24 station-days without a value",
        ["2t"],
        climate4r_value_tas,
    ),
    "cordex_iberia": merged_winters(
        CORDEX_FILES,
        "CORDEX EUR-44, KNMI-RACMO22E driven by ICHEC-EC-EARTH (historical r1i1p1), daily mean 2 m temperature "
        "and precipitation, 0.44 deg rotated-pole grid over Iberia (28 x 30)",
        climate4r_rotated,
    ),
    "wfde5_uk_land": Source(
        f"{UNIFHY}/data/{WFDE5_FILES[0][0]}",
        WFDE5_FILES[0][1],
        "WFDE5 (WATCH forcing on ERA5), hourly, 2017-01, Tair, Qair, Wind, pr, SWdown, LWdown, 0.5 deg, British Isles "
        "(20 x 28; land only: the sea has no value)",
        ("2017-01-01T00:00:00", "2017-01-31T23:00:00", "1h"),
        "netcdf",
        {"param": [variable for _, _, variable in WFDE5_FILES]},
        wfde5_merged,
        allow_nans=True,
        companions=tuple((f"{UNIFHY}/data/{file}", md5) for file, md5, _ in WFDE5_FILES[1:]),
    ),
}


def download(source: Source, into: Path) -> Path:
    """The source's file (and its companions) in ``into``, each downloaded unless already there
    with the right MD5; the first file's path."""
    paths = [_download(url, md5, into) for url, md5 in ((source.url, source.md5), *source.companions)]
    return paths[0]


def _download(url: str, md5: str, into: Path) -> Path:
    """``url``'s file in ``into``, downloaded unless already there with MD5 ``md5``."""
    path = into / url.rsplit("/", 1)[-1]
    if not path.exists() or _md5(path) != md5:
        into.mkdir(parents=True, exist_ok=True)
        print(f"downloading {url}", flush=True)
        partial = path.with_suffix(path.suffix + ".part")
        urllib.request.urlretrieve(url, partial)  # noqa: S310 - a fixed https URL
        got = _md5(partial)
        if got != md5:
            partial.unlink()
            sys.exit(f"error: {url} has MD5 {got}, expected {md5}: not the published file")
        partial.replace(path)
    return path


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()  # noqa: S324 - a checksum, not security


def recipe(source: Source, file: Path) -> dict:
    """anemoi-datasets' recipe for a store of ``file``."""
    start, end, frequency = source.dates
    dates = {"start": start, "end": end, "frequency": frequency}
    if source.missing:
        dates["missing"] = list(source.missing)
    built = {
        "description": source.description,
        "dates": dates,
        "input": {source.source: {"path": str(file), **source.select}},
    }
    return built | ({"build": {"allow_nans": True}} if source.allow_nans else {})


def build(name: str, out: Path | None = None, overwrite: bool = False) -> Path:
    """Download ``name``'s file and build its store (``data/real/<name>.zarr`` by default)."""
    source = SOURCES[name]
    file = download(source, DATA / name if source.companions else DATA)
    if source.convert is not None:
        file = source.convert(file)
    store = out or DATA / f"{name}.zarr"
    if store.exists() and not overwrite:
        print(f"{store} exists (--overwrite to build it again)")
        return store
    return create_store(recipe(source, file), store, overwrite)


def create_store(recipe_: dict, store: Path, overwrite: bool = False) -> Path:
    """``anemoi-datasets create`` of ``recipe_`` into ``store`` (the recipe is kept beside it)."""
    store.parent.mkdir(parents=True, exist_ok=True)
    recipe_path = store.with_suffix(".yaml")
    recipe_path.write_text(json.dumps(recipe_, indent=2))  # JSON is YAML
    command = [sys.executable, "-m", "anemoi.datasets", "create", str(recipe_path), str(store)]
    if overwrite:
        command.append("--overwrite")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: anemoi-datasets create {recipe_path} failed:\n{done.stderr[-3000:]}")
    print(f"built {store}")
    return store


def test_sample() -> Path:
    """The tests' sample: the 6-hourly fields (00, 06, 12, 18 UTC) of ``era5_uk_2t``'s GRIB,
    message by message (about 0.4 MiB)."""
    import eccodes

    file = download(SOURCES["era5_uk_2t"], DATA)
    TEST_SAMPLE.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with file.open("rb") as src, TEST_SAMPLE.open("wb") as out:
        while (handle := eccodes.codes_grib_new_from_file(src)) is not None:
            if eccodes.codes_get(handle, "time") % 600 == 0:
                eccodes.codes_write(handle, out)
                kept += 1
            eccodes.codes_release(handle)
    print(f"wrote {TEST_SAMPLE}: {kept} fields, {TEST_SAMPLE.stat().st_size / 2**20:.2f} MiB")
    return TEST_SAMPLE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"sources to build: {', '.join(SOURCES)}")
    parser.add_argument("--list", action="store_true", help="list the sources")
    parser.add_argument("--overwrite", action="store_true", help="build a store again")
    parser.add_argument("--test-sample", action="store_true", help="rebuild the tests' sample file")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in SOURCES]
    if unknown:
        sys.exit(f"error: unknown source {unknown}: choose among {', '.join(SOURCES)}")
    if args.list or not (args.names or args.test_sample):
        for name, source in SOURCES.items():
            print(f"{name}: {source.description}")
    for name in args.names:
        build(name, overwrite=args.overwrite)
    if args.test_sample:
        test_sample()


if __name__ == "__main__":
    main()
