"""Real reanalysis end to end: the store anemoi-datasets builds from the tests' ERA5 sample
(2 m temperature over the British Isles, 6-hourly, March 2019; ``scripts/real_data.py
--test-sample`` cut it from xarray's tutorial file), read by gridshard, trained sharded exactly as
on one rank, and trained and scored by the training command. Skipped without anemoi-datasets
(it runs in ``.venv-anemoi``, as CI does)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module

import training.config.schema  # noqa: F401  (registers the schema)
from tests.training.conftest import SHORT_RUN
from training.data import ZarrDataset

pytest.importorskip("anemoi.datasets")
pytestmark = pytest.mark.filterwarnings("ignore:Loading the settings config file:DeprecationWarning")  # anemoi-utils

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "era5_uk_2t_2019-03_6h.grib"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample's store, built by ``anemoi-datasets create`` (its own process: ecCodes and
    torch's spawned ranks do not share an interpreter's exit well)."""
    root = tmp_path_factory.mktemp("real")
    recipe = {
        "dates": {"start": "2019-03-01T00:00:00", "end": "2019-03-31T18:00:00", "frequency": "6h"},
        "input": {"grib": {"path": str(SAMPLE), "param": ["2t"]}},
    }
    (root / "uk.yaml").write_text(json.dumps(recipe))
    command = [sys.executable, "-m", "anemoi.datasets", "create", str(root / "uk.yaml"), str(root / "uk.zarr")]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "uk.zarr"


def _config(run_dir: Path, store: Path, *overrides: str):
    """The README's command for a store on the sample (the rest derived from it), shrunk to seconds."""
    small = [
        f"run_dir={run_dir}",
        "data=zarr",
        f"data.path={store}",
        "model.trainable_size=8",  # node parameters: their split over ranks is checked below
        "model.num_layers=2",
        "model.num_channels=32",
        "model.window_size=40",
        *SHORT_RUN,
    ]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="config", overrides=[*small, *overrides])


def test_the_sample_is_read_as_its_grid(store):
    ds = ZarrDataset(store)
    assert ds.variables == ["2t"] and (ds.n_times, ds.n_points, ds.frequency_s) == (124, 33 * 49, 6 * 3600)
    assert ds.point_set.name == "regional lat-lon 33 x 49 at 0.25 degrees"
    assert (ds.latitudes.min(), ds.latitudes.max(), ds.longitudes.min(), ds.longitudes.max()) == (50, 58, -10, 2)
    kelvin = ds.denormalise(ds.state(0))
    assert 250 < kelvin.min() < kelvin.max() < 300  # 2 m temperature in K, in March


@pytest.mark.parametrize(
    "strategy", ["shard_sequence", "shard_channels", "shard_sequence model.baseline=linear_regression"]
)
def test_two_ranks_train_as_one_on_real_data(tmp_path, store, strategy):
    """Loss, every gradient (the node parameters' split by points among them) and every
    parameter after the step, against one rank, at fp32; also with each step learned over the
    linear regression, which each rank fits on its own points."""
    from training.config.parity_settings import TOLERANCES
    from training.parity.check import run

    name, *more = strategy.split()
    result = run(_config(tmp_path, store, f"strategy={name}", *more, "trainer.nprocs=2", "parity.steps=2"))
    assert not result["breach"], result["verdict"]
    judged = [r for r in result["rows"] if r.judged]
    assert {r.tensor for r in judged} >= {"data_nodes.weight", "hidden_nodes.weight"}
    assert max(r.max_rel_diff for r in judged) <= TOLERANCES["fp32"]


def test_the_training_command_trains_and_scores_on_real_data(tmp_path, store):
    from training.app import run

    cfg = _config(tmp_path, store, "logging.mlflow=false")  # the ranks derived too
    run(cfg)
    saved = (tmp_path / "config.yaml").read_text()
    recipe = ("baseline: linear_regression", "trainable_size: 8", "multistep_input: 2", "batch_size: 8")
    for derived in ("hidden_grid: data", "hidden_stride: 2", "lead_time: 6", "nprocs: 1", *recipe):
        assert derived in saved, derived  # a regional box of 1,617 points, 6-hourly, one rank, its recipe
    table = (tmp_path / "skill.md").read_text()
    kinds = ("model", "persistence", "hourly_climatology", "anomaly_persistence", "linear_regression")
    for kind in (*kinds, "damped_persistence"):
        assert f"{kind} RMSE" in table
    rmse = np.loadtxt(tmp_path / "skill.csv", delimiter=",", skiprows=1, usecols=3)
    assert len(rmse) >= 2 * 4 and np.isfinite(rmse).all() and (rmse > 0).all()  # 2 leads x model and baselines
