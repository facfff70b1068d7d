"""Training on every kind of grid an anemoi-datasets store holds: synthetic stores on a regional
box (a hidden grid of its own points) and a global point set (and with GRIDSHARD_ALL_GRID_KINDS=1
a global lat-lon grid in the store's own point order, a reduced Gaussian grid and a rotated
regional grid) train two steps end to end, and 3 model-parallel ranks (uneven blocks) give one
rank's losses and parameters."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from processor.grids import gaussian_latitudes
from tests.training.conftest import train_sharded_and_single
from training.checkpoint.files import load_checkpoint
from training.data import ZarrDataset, write_rossby_haurwitz


def _regular_latlon() -> tuple[np.ndarray, np.ndarray]:
    lats, lons = np.arange(90, -90.1, -6.0), np.arange(-180, 180, 6.0)  # 31 x 60, the poles included
    return np.repeat(lats, len(lons)), np.tile(lons, len(lats))


def _reduced_gaussian() -> tuple[np.ndarray, np.ndarray]:
    lats, _ = gaussian_latitudes(12)
    counts = np.maximum(20, np.round(48 * np.cos(np.radians(lats)))).astype(int)
    return np.repeat(lats, counts), np.concatenate([np.arange(c) * 360.0 / c for c in counts])


def _box() -> tuple[np.ndarray, np.ndarray]:
    lats, lons = np.arange(62, 50.1, -0.5), np.arange(-6, 6.1, 0.5)  # 25 x 25 across longitude 0
    return np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360


def _fibonacci(n: int = 1200) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(n) + 0.5
    return np.degrees(np.arcsin(1 - 2 * i / n)), np.degrees(np.pi * (1 + 5**0.5) * i) % 360 - 180


def _rotated_regional() -> tuple[np.ndarray, np.ndarray]:
    """A 25 x 25 grid turned 30 degrees in the tangent plane at (45N, 10E): a projected regional
    grid, whose rows are not latitude rings."""
    x, y = np.meshgrid(np.linspace(-0.1, 0.1, 25), np.linspace(-0.1, 0.1, 25))
    turn = np.radians(30)
    east, north = x * np.cos(turn) - y * np.sin(turn), x * np.sin(turn) + y * np.cos(turn)
    lat0, lon0 = np.radians(45), np.radians(10)
    centre = np.array([np.cos(lat0) * np.cos(lon0), np.cos(lat0) * np.sin(lon0), np.sin(lat0)])
    e = np.array([-np.sin(lon0), np.cos(lon0), 0.0])
    n = np.cross(centre, e)
    xyz = centre + east.reshape(-1, 1) * e + north.reshape(-1, 1) * n
    xyz /= np.linalg.norm(xyz, axis=1, keepdims=True)
    return np.degrees(np.arcsin(xyz[:, 2])), np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))


# kind: (coordinates, the hidden grid's overrides). Lat-lon, reduced Gaussian and projected
# regional grids train on real GRIB coordinates in tests/training/data/test_grib_stores.py
# (.venv-anemoi); set GRIDSHARD_ALL_GRID_KINDS=1 to train their synthetic copies here too.
KINDS = {
    "regional_latlon": (_box, ["model.hidden_grid=data", "model.hidden_stride=2"]),
    "unstructured": (_fibonacci, ["model.hidden_grid=o8"]),
}
if os.environ.get("GRIDSHARD_ALL_GRID_KINDS") == "1":
    KINDS["regular_latlon"] = (_regular_latlon, ["model.hidden_grid=o8"])
    KINDS["reduced_gaussian"] = (_reduced_gaussian, ["model.hidden_grid=o8"])
    KINDS["regional unstructured"] = (_rotated_regional, ["model.hidden_grid=data", "model.hidden_stride=2"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_grid_kind_trains_sharded_exactly(tmp_path, kind):
    coordinates, hidden = KINDS[kind]
    store = write_rossby_haurwitz(tmp_path / "store.zarr", *coordinates(), steps=24, seed=5)
    dataset = ZarrDataset(store)
    assert dataset.point_set.kind == kind.split()[-1]
    assert dataset.area_weights.mean() == pytest.approx(1.0)
    settings = ["data.grid=null", "trainer.val_interval=2", "data.val_fraction=0.25", *hidden]
    settings += ["evaluate.at_end_of_training=false", "logging.mlflow=false"]  # training is what is compared
    folders = train_sharded_and_single(tmp_path, store, *settings)
    saved, reference = (load_checkpoint(folder / "latest.pt")["model"] for folder in folders)
    for name, value in reference.items():
        # Key biases' gradients are round-off (a softmax ignores a constant shift): Adam scales that up.
        if not name.endswith(("k_norm.bias", "lin_key.bias")):
            torch.testing.assert_close(saved[name], value, rtol=1e-3, atol=1e-5, msg=name)  # as test_app
