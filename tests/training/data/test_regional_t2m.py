"""The synthetic regional hourly 2 m temperature store and its preset: a box, a daily cycle that
follows the sun, static fields, and a run of `data=regional_t2m` end to end."""

from __future__ import annotations

import numpy as np
from hydra import compose, initialize_config_module

from training.app import run
from training.data import ZarrDataset
from training.data.forcings import local_solar_hours
from training.data.regional_t2m import generate_regional_t2m


def test_the_store_is_a_box_with_a_daily_cycle_over_land(tmp_path):
    dataset = ZarrDataset(generate_regional_t2m(tmp_path / "regional_t2m.zarr", steps=48, seed=2))
    assert dataset.point_set.kind == "regional_latlon" and dataset.variables == ["2t", "lsm", "z"]
    assert dataset.frequency_s == 3600 and dataset.n_times == 48
    states = np.stack([dataset.denormalise(dataset.state(t)) for t in range(48)])  # (time, points, variables)
    land = states[0, :, 1] > 0.5
    assert 0.2 < land.mean() < 0.9 and (states[:, :, 1] == states[:1, :, 1]).all()  # static
    hours = local_solar_hours(dataset.dates, dataset.longitudes)  # (time, points)
    afternoon, night = (np.abs(hours - 15) < 2), (np.abs(hours - 3) < 2)
    t2m = states[:, :, 0]
    land_cycle = t2m[afternoon & land[None]].mean() - t2m[night & land[None]].mean()
    sea_cycle = t2m[afternoon & ~land[None]].mean() - t2m[night & ~land[None]].mean()
    assert land_cycle > 5 and abs(sea_cycle) < land_cycle / 3  # 1 K at sea, lost in two days of weather


def test_the_preset_trains_on_two_ranks(tmp_path):
    overrides = [
        "data=regional_t2m",
        f"data.path={tmp_path / 'regional_t2m_small.zarr'}",
        "data.generate_steps=96",
        "data.val_fraction=0.3",
        "model.multistep_input=1",  # 96 hourly dates: 2 input states (derived) leave no validation sample
        f"run_dir={tmp_path / 'run'}",
        "model.num_layers=1",
        "model.num_channels=16",
        "model.window_size=20",
        "trainer.steps=2",
        "trainer.val_interval=2",
        "trainer.val_batches=1",
        "evaluate.samples=2",
        "logging.mlflow=false",
    ]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    result = run(cfg)
    assert len(result["history"]) == 2
    skill = (tmp_path / "run" / "skill.md").read_text()
    assert "### 2t" in skill and "anomaly_persistence RMSE" in skill and "### lsm" not in skill
