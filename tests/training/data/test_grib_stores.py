"""Stores that anemoi-datasets builds from real GRIB fields, read by gridshard's reader: the grid
it infers for each, cell areas, points and values against anemoi's own ``open_dataset``.

The fields are cfgrib 0.9.15.1's sample data (``scripts/setup_anemoi.sh`` puts them in
``.venv-anemoi/grib-samples``): 3 and 5 degree lat-lon with the poles, N48 regular and reduced
Gaussian, a 2.5 km Lambert conformal grid. Skipped without anemoi-datasets or the samples."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from training.data import ZarrDataset
from training.data.grid_check import infer_grid

anemoi_datasets = pytest.importorskip("anemoi.datasets")
pytestmark = pytest.mark.filterwarnings("ignore:Loading the settings config file:DeprecationWarning")  # anemoi-utils

SAMPLES = Path(__file__).resolve().parents[3] / ".venv-anemoi" / "grib-samples"


class Case(NamedTuple):
    """What a sample file holds, the recipe's selection from it, and what the store must be."""

    dates: tuple[str, str, str]  # start, end, frequency: the file's own (valid) dates
    params: list[str]
    levels: list[int] | None
    variables: list[str]
    shape: tuple[int, int, int, int]  # time, variable, member, points
    kind: str
    name: str


ONE = ("2017-10-18T12:00:00", "2017-10-18T12:00:00", "6h")  # the surface fields' one date
CASES = {
    "era5-levels-members.grib": Case(
        ("2017-01-01T00:00:00", "2017-01-02T12:00:00", "12h"), ["t", "z"], [500, 850],
        ["t_500", "t_850", "z_500", "z_850"], (4, 4, 10, 7320), "regular_latlon",
        "regular lat-lon 61 x 120 with the poles",
    ),
    "regular_ll_sfc.grib": Case(
        ONE, ["skt"], None, ["skt"], (1, 1, 1, 2664), "regular_latlon", "regular lat-lon 37 x 72 with the poles"
    ),
    "regular_gg_sfc.grib": Case(ONE, ["10u"], None, ["10u"], (1, 1, 1, 18432), "regular_gaussian", "f48"),
    "reduced_gg.grib": Case(ONE, ["10u"], None, ["10u"], (1, 1, 1, 13280), "reduced_gaussian", "n48"),
    "lambert_grid.grib": Case(  # an 18 h forecast from 1990-01-25 00 UTC
        ("1990-01-25T18:00:00", "1990-01-25T18:00:00", "6h"), ["nlwrs"], None, ["nlwrs"],
        (1, 1, 1, 475 * 475), "unstructured", "225625 points, regional",
    ),
}  # fmt: skip


class Store(NamedTuple):
    """A store anemoi-datasets built and gridshard's reader of it."""

    path: Path
    ds: ZarrDataset


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Store]:
    """The store ``anemoi-datasets create`` builds from a sample and gridshard's reader of it
    (both made once per module)."""
    root = tmp_path_factory.mktemp("grib-stores")
    built: dict[str, Store] = {}

    def build(file: str) -> Store:
        if not (SAMPLES / file).is_file():
            pytest.skip(f"no {SAMPLES / file}: scripts/setup_anemoi.sh fetches the GRIB samples")
        if file not in built:
            case = CASES[file]
            start, end, frequency = case.dates
            source = {"path": str(SAMPLES / file), "param": case.params}
            if case.levels:
                source["level"] = case.levels
            recipe = {"dates": {"start": start, "end": end, "frequency": frequency}, "input": {"grib": source}}
            (root / f"{file}.yaml").write_text(json.dumps(recipe))  # JSON is YAML
            path = root / f"{file}.zarr"
            # Its own process: ecCodes' handles, freed again at this interpreter's exit once
            # torch's processes have run, aborted it ("double free or corruption").
            command = [sys.executable, "-m", "anemoi.datasets", "create", str(root / f"{file}.yaml"), str(path)]
            done = subprocess.run(command, capture_output=True, text=True)
            assert done.returncode == 0, f"anemoi-datasets create {file}: {done.stderr[-2000:]}"
            built[file] = Store(path, ZarrDataset(path))
        return built[file]

    return build


@pytest.mark.parametrize("file", CASES)
def test_the_grid_is_inferred(store: Callable[[str], Store], file: str) -> None:
    """Kind, name, areas (the whole sphere for global grids) and ring order of each grid."""
    case, ds = CASES[file], store(file).ds
    assert ds.variables == case.variables
    assert (ds.n_times, len(ds.variables), ds.n_members, ds.n_points) == case.shape
    assert (ds.point_set.kind, ds.point_set.name) == (case.kind, case.name)
    assert infer_grid(ds.point_set, ds.latitudes, ds.longitudes, ds.resolution) == case.name
    assert ds.point_set.is_global == (case.kind != "unstructured")
    assert ds.area_weights.mean() == pytest.approx(1.0) and ds.area_weights.min() > 0
    if ds.point_set.is_global:  # the cells tile the sphere; rings north to south
        assert ds.point_set.areas.sum() == pytest.approx(4 * np.pi, rel=1e-9)
        assert (np.diff(ds.latitudes) <= 0).all()


@pytest.mark.parametrize("file", CASES)
def test_the_reader_agrees_with_open_dataset(store: Callable[[str], Store], file: str) -> None:
    """The same points (in processor order) and values, every member, as anemoi reads them."""
    path, ds = store(file)
    theirs = anemoi_datasets.open_dataset(path)
    np.testing.assert_array_equal(np.sort(ds.latitudes), np.sort(theirs.latitudes))
    order = ds.point_set.order
    np.testing.assert_array_equal(ds.longitudes, theirs.longitudes[order])
    for t in range(ds.n_times):
        expected = np.asarray(theirs[t])[:, :, order]  # (variable, member, points)
        for member in range(ds.n_members):
            got = ds.denormalise(ds.state(t, member=member)).T
            np.testing.assert_allclose(got, expected[:, member], rtol=1e-6, atol=1e-6 * np.abs(expected).max())


def test_lambert_cell_areas_are_the_grid_cells(store: Callable[[str], Store]) -> None:
    """Each point's area is about its 2.5 km cell's (a quarter at corners, half on edges), and
    they sum to the area the grid covers: its 474 x 474 quadrilaterals between the points."""
    path, ds = store("lambert_grid.grib")
    theirs = anemoi_datasets.open_dataset(path)
    lat, lon = np.radians(theirs.latitudes), np.radians(theirs.longitudes)  # the store's order: rows of 475
    xyz = np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1).reshape(475, 475, 3)
    a, b, c, d = xyz[:-1, :-1], xyz[:-1, 1:], xyz[1:, 1:], xyz[1:, :-1]
    quads = 0.5 * np.linalg.norm(np.cross(c - a, d - b), axis=-1)  # planar quadrilaterals
    assert ds.point_set.areas.sum() == pytest.approx(quads.sum(), rel=1e-3)
    assert ds.area_weights.max() < 1.1


HIDDEN = {"lambert_grid.grib": ["model.hidden_grid=data", "model.hidden_stride=2"]}  # regional: its own points


@pytest.mark.parametrize("file", CASES)
def test_each_real_grid_trains_sharded_exactly(store: Callable[[str], Store], tmp_path: Path, file: str) -> None:
    """Rossby-Haurwitz waves written on the real store's points (in its own order; the Lambert
    grid cut to every 8th row and column), trained two steps on 3 model-parallel ranks (uneven
    blocks) and on one: the same losses and parameters."""
    import torch

    from tests.training.conftest import small_config
    from training.app import run
    from training.checkpoint.files import load_checkpoint
    from training.data import write_rossby_haurwitz

    theirs = anemoi_datasets.open_dataset(store(file).path)
    lat, lon = np.asarray(theirs.latitudes), np.asarray(theirs.longitudes)
    if file == "lambert_grid.grib":
        keep = np.arange(475 * 475).reshape(475, 475)[::8, ::8].reshape(-1)
        lat, lon = lat[keep], lon[keep]
    data = write_rossby_haurwitz(tmp_path / "store.zarr", lat, lon, steps=24, seed=4)
    settings = ["data.grid=null", "trainer.steps=2", "data.val_fraction=0.25", "evaluate.at_end_of_training=false"]
    settings += ["logging.mlflow=false"]
    settings += HIDDEN.get(file, ["model.hidden_grid=o8"])
    ranks = ("trainer.nprocs=3", "trainer.ranks_per_model=3")
    sharded = run(small_config(tmp_path / "sharded", data, *settings, *ranks))
    single = run(
        small_config(
            tmp_path / "single", data, *settings, "strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"
        )
    )
    losses = [np.array([m["train/loss"] for _, m in r["history"]]) for r in (sharded, single)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    saved, reference = (
        load_checkpoint(tmp_path / d / "checkpoints" / "latest.pt")["model"] for d in ("sharded", "single")
    )
    for name, value in reference.items():
        if not name.endswith(("k_norm.bias", "lin_key.bias")):  # round-off gradients, scaled up by Adam
            torch.testing.assert_close(saved[name], value, rtol=1e-3, atol=1e-5, msg=name)  # as test_app
