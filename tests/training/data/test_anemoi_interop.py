"""Datasets both ways, against the real anemoi-datasets (``.venv-anemoi``; skipped without it):
anemoi reads the store gridshard writes, and gridshard trains on a store anemoi-datasets built
from a GRIB file (with a missing date), directly or through ``data.open_dataset``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.training.conftest import small_config
from training.app import run
from training.data import DatasetError, ZarrDataset, generate_rossby_haurwitz
from training.launch.launcher import prepare

anemoi_datasets = pytest.importorskip("anemoi.datasets")

MISSING = "2020-01-02T06:00:00"  # index 5 of the 6-hourly dates


def _anemoi_cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "anemoi.datasets", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def ours(tmp_path_factory) -> Path:
    """gridshard's generated store: o16, 40 dates, 2 members, date index 7 missing."""
    return generate_rossby_haurwitz(tmp_path_factory.mktemp("ours") / "rh.zarr", "o16", 40, 3, members=2, missing=(7,))


def test_anemoi_opens_the_generated_store(ours):
    ds = anemoi_datasets.open_dataset(ours)
    assert ds.shape == (40, 5, 2, 1600) and ds.missing == {7}
    assert ds.resolution == "O16" and tuple(ds.field_shape) == (1600,)
    np.testing.assert_allclose(ds.statistics["mean"], ZarrDataset(ours).mean, rtol=1e-6, atol=1e-7)

    window = anemoi_datasets.open_dataset(ours, start="2020-01-03", end="2020-01-06")
    assert len(window) == 16 and str(window.dates[0]) == "2020-01-03T00:00:00"
    picked = anemoi_datasets.open_dataset(ours, select=["tracer", "u"])
    assert picked.variables == ["tracer", "u"] and picked[3].shape == (2, 2, 1600)
    twelve = anemoi_datasets.open_dataset(ours, frequency="12h")
    assert len(twelve) == 20 and twelve.missing == set()  # index 7 (18:00) is not a 12-hourly date

    data = np.asarray(ds.store["data"][:], dtype=np.float64)  # (time, variable, member, points)
    diffs = data[2:] - data[:-2]
    ok = ~np.isnan(diffs).any(axis=(1, 2, 3))
    expected = np.moveaxis(diffs[ok], 1, 0).reshape(5, -1).mean(axis=1)
    np.testing.assert_allclose(twelve.statistics_tendencies()["mean"], expected, rtol=1e-5, atol=1e-9)
    assert set(ds.statistics_tendencies("6h")) == {"mean", "stdev", "minimum", "maximum"}


def test_anemoi_datasets_inspect_runs(ours):
    out = _anemoi_cli("inspect", str(ours))
    assert "Format version: 0.22" in out and "Missing    : 1" in out and "Statistics ready" in out


@pytest.fixture(scope="module")
def built_by_anemoi(tmp_path_factory) -> Path:
    """A store made by ``anemoi-datasets create`` from a GRIB file on o32 (16 six-hourly dates of
    2t and msl), with one missing date and 6h/12h tendency statistics."""
    eccodes = pytest.importorskip("eccodes")
    root = tmp_path_factory.mktemp("anemoi")
    half = 4 * np.arange(1, 33) + 16  # octahedral: 4 i + 16 points on ring i
    pl = np.concatenate([half, half[::-1]])
    lat = np.repeat(np.linspace(1.5, -1.5, 64), pl)
    lon = np.concatenate([np.arange(n) * 2 * np.pi / n for n in pl])
    with open(root / "o32.grib", "wb") as out:
        for i in range(16):
            day, hour = divmod(6 * i, 24)
            for name, base, scale in (("2t", 280.0, 10.0), ("msl", 101000.0, 500.0)):
                h = eccodes.codes_grib_new_from_samples("reduced_gg_pl_32_grib2")
                eccodes.codes_set_long_array(h, "pl", pl)
                eccodes.codes_set(h, "dataDate", 20200101 + day)
                eccodes.codes_set(h, "dataTime", 100 * hour)
                eccodes.codes_set(h, "shortName", name)
                eccodes.codes_set_values(h, base + scale * np.cos(lat) * np.sin(lon - 0.2 * i + (name == "msl")))
                eccodes.codes_write(h, out)
                eccodes.codes_release(h)
    recipe = root / "recipe.yaml"
    recipe.write_text(
        "dates: {start: 2020-01-01T00:00:00, end: 2020-01-04T18:00:00, frequency: 6h, "
        f"missing: ['{MISSING}']}}\n"
        "statistics: {tendencies: [6h, 12h]}\n"
        f"input: {{grib: {{path: {root / 'o32.grib'}, param: [2t, msl]}}}}\n"
    )
    _anemoi_cli("create", str(recipe), str(root / "o32.zarr"))
    return root / "o32.zarr"


def test_reader_on_a_store_anemoi_built(built_by_anemoi):
    ds = ZarrDataset(built_by_anemoi)
    assert ds.variables == ["2t", "msl"] and ds.missing == {5} and ds.frequency_s == 6 * 3600
    assert ds.resolution == "O32" and ds.dates.dtype == np.dtype("datetime64[s]")
    ds.check_finite()  # anemoi wrote NaN at the missing date: not an error there


def _train(tmp_path: Path, store: Path, *overrides: str) -> dict:
    settings = [
        "data.grid=null",
        "trainer.steps=3",
        "trainer.val_interval=3",
        "logging.mlflow=false",
        "evaluate.at_end_of_training=false",
        *overrides,
    ]
    result = run(small_config(tmp_path, store, *settings))
    losses = [m["train/loss"] for _, m in result["history"]]
    assert len(losses) == 3 and all(np.isfinite(losses)), losses
    return result


def test_training_on_a_store_anemoi_built_with_a_missing_date(tmp_path, built_by_anemoi):
    """Two ranks (shard_sequence), the grid inferred from the store."""
    assert prepare(small_config(tmp_path, built_by_anemoi, "data.grid=null")).data.grid == "o32"
    _train(tmp_path, built_by_anemoi)


def test_training_through_open_dataset(tmp_path, built_by_anemoi):
    spec = f"{{dataset:'{built_by_anemoi}',start:'2020-01-01T06:00:00',select:[msl]}}"
    _train(
        tmp_path,
        built_by_anemoi,
        f"data.open_dataset={spec}",
        "data.lead_time=12",
        "data.val_fraction=0.25",
        "trainer.nprocs=1",
        "trainer.ranks_per_model=1",
        "strategy=none",
    )


def test_a_lead_time_off_the_frequency_is_refused(tmp_path, built_by_anemoi):
    with pytest.raises(DatasetError, match=r"data.lead_time = 9 \(hours\) is not a positive multiple .* \(6h\)"):
        prepare(small_config(tmp_path, built_by_anemoi, "data.grid=null", "data.lead_time=9"))
