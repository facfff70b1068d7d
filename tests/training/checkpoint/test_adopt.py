"""``python -m training.evaluate`` and ``python -m training.predict`` take the checkpoint's own
settings, as a resumed run does: a run trained on a regional store (``data=zarr data.path=S``)
is evaluated and predicted with nothing but the checkpoint on the command line; what the command
line sets goes on top, a setting the parameters depend on must keep the checkpoint's value; and
a forecast store has the source store's point order."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from hydra import compose, initialize_config_module

from tests.processes import run_in_own_session
from training import evaluate, predict
from training.checkpoint.adopt import adopt_checkpoint
from training.checkpoint.files import CheckpointError
from training.config.schema import run_config
from training.data import ZarrDataset, write_rossby_haurwitz
from training.launch.errors import EXIT_USER_ERROR
from training.launch.run_settings import given_keys

# The regional run, on one rank (as the commands derive for its grid).
TRAINED = [
    "data=zarr",
    "model.hidden_grid=data",
    "model.hidden_stride=2",
    "model.num_layers=1",
    "model.num_channels=16",
    "model.num_heads=2",
    "model.window_size=16",
    "strategy=none",
    "trainer.nprocs=1",
    "trainer.ranks_per_model=1",
    "trainer.steps=2",
    "trainer.val_interval=2",
    "trainer.val_batches=1",
    "trainer.checkpoint_interval=2",
    "trainer.warmup_steps=1",
    "evaluate.steps=2",
    "evaluate.samples=2",
    "evaluate.at_end_of_training=false",
    "logging.mlflow=false",
]


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="configs", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.fixture(scope="module")
def regional(tmp_path_factory) -> tuple[Path, Path]:
    """A 13 x 17 box whose store runs south to north (the processor's order runs north to south),
    and a run trained on it: ``(store, checkpoint)``."""
    from training.app import run as train

    root = tmp_path_factory.mktemp("regional")
    lats, lons = np.arange(40.0, 52.5, 1.0), np.arange(-8.0, 8.5, 1.0)
    store = write_rossby_haurwitz(
        root / "box.zarr", np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360, steps=32, seed=4
    )
    assert ZarrDataset(store)._order is not None  # the reader reorders its points
    train(_compose([f"run_dir={root / 'run'}", f"data.path={store}", *TRAINED]))
    return store, root / "run" / "checkpoints" / "latest.pt"


@pytest.fixture(autouse=True)
def _no_default_data(tmp_path, monkeypatch):
    """The default data preset, were it used, is written under tmp_path, not the working directory."""
    monkeypatch.setenv("GRIDSHARD_DATA", str(tmp_path / "default-data"))


def _adopted(command_line: list[str], key: str = "evaluate"):
    """The resolved configuration of ``command_line`` made the checkpoint's."""
    resolved = run_config(_compose(command_line))
    adopt_checkpoint(resolved, key, given_keys(command_line))
    return resolved


def test_the_checkpoint_s_settings_are_taken_and_the_command_line_s_on_top(regional, tmp_path):
    store, checkpoint = regional
    cfg = _adopted([f"run_dir={tmp_path}", f"evaluate.checkpoint={checkpoint}"])
    assert cfg.data.path == str(store) and cfg.data.grid.startswith("regional lat-lon 13 x 17")
    assert (cfg.model.hidden_grid, cfg.model.num_channels, cfg.model.num_heads) == ("data", 16, 2)
    assert (cfg.strategy.name, cfg.trainer.nprocs, cfg.trainer.ranks_per_model) == ("none", 1, 1)
    assert (cfg.evaluate.steps, cfg.evaluate.checkpoint, cfg.run_dir) == (2, str(checkpoint), str(tmp_path))

    moved = tmp_path / "moved.zarr"
    shutil.copytree(store, moved)
    given = ["trainer.nprocs=2", "trainer.ranks_per_model=2", "strategy=shard_heads", "trainer.precision=bf16"]
    cfg = _adopted([f"run_dir={tmp_path}", f"evaluate.checkpoint={checkpoint}", f"data.path={moved}", *given])
    assert cfg.data.path == str(moved) and cfg.data.forcing == _compose(["data=zarr"]).data.forcing
    assert (cfg.strategy.name, cfg.trainer.nprocs, cfg.trainer.ranks_per_model) == ("shard_heads", 2, 2)
    assert cfg.trainer.precision == "bf16" and cfg.model.num_channels == 16
    # the training command line repeated is no conflict
    cfg = _adopted(
        [f"run_dir={tmp_path}", f"predict.checkpoint={checkpoint}", f"data.path={store}", *TRAINED], "predict"
    )
    assert cfg.predict.checkpoint == str(checkpoint) and cfg.model.window_size == 16


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.num_channels=32", "model.num_channels"),
        ("model=small", "model.num_channels"),  # its derived keys (auto, null) are left to the checkpoint
        ("data.forcing=[cos_latitude]", "data.forcing"),
        ("model.multistep_input=3", "model.multistep_input"),  # trained with 2: derived on a regional store
    ],
)
def test_an_override_the_parameters_do_not_allow_is_one_line_naming_it(regional, tmp_path, override, key):
    _, checkpoint = regional
    with pytest.raises(CheckpointError) as raised:
        _adopted([f"run_dir={tmp_path}", f"evaluate.checkpoint={checkpoint}", override])
    message = str(raised.value)
    assert message.startswith(f"{key} = ") and f"was trained with {key} = " in message and "\n" not in message


def test_evaluate_and_predict_need_only_the_checkpoint(regional, tmp_path):
    store, checkpoint = regional
    command_line = [f"run_dir={tmp_path / 'eval'}", f"evaluate.checkpoint={checkpoint}"]
    out = evaluate.run(_compose(command_line), given_keys(command_line))
    assert out["checkpoint_step"] == 2 and out["skill"].lead_hours == [6.0, 12.0]
    assert not (tmp_path / "default-data").exists()

    source = zarr.open_group(str(store), mode="r")
    init = str(ZarrDataset(store).dates[20])
    command_line = [
        f"run_dir={tmp_path / 'predict'}",
        f"predict.checkpoint={checkpoint}",
        f"predict.initial_dates=[{init}]",
        "predict.steps=1",
        f"predict.output={tmp_path / 'forecasts'}",
    ]
    (path,) = predict.run(_compose(command_line), given_keys(command_line))
    _assert_in_source_order(Path(path), source, 20)


def _assert_in_source_order(path: Path, source, t: int) -> None:
    """The forecast store at ``path`` has the source store's points, point by point: coordinates,
    and the initial state (date index ``t`` of the source) as the source holds it."""
    forecast = zarr.open_group(str(path), mode="r")
    np.testing.assert_array_equal(forecast["latitudes"][:], source["latitudes"][:])
    np.testing.assert_array_equal(forecast["longitudes"][:], source["longitudes"][:])
    np.testing.assert_allclose(forecast["data"][0], source["data"][t], rtol=1e-5, atol=1e-4)
    assert np.isfinite(forecast["data"][1]).all()


@pytest.mark.slow
def test_the_commands_take_the_checkpoint_s_settings(regional, tmp_path):
    store, checkpoint = regional
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "OMP_NUM_THREADS": "1"}
    env["GRIDSHARD_DATA"] = str(tmp_path / "default-data")

    def command(module: str, *args: str) -> tuple[int, str]:
        rc, out, err = run_in_own_session([sys.executable, "-m", module, *args], tmp_path, env, timeout_s=300)
        return rc, out + err

    rc, text = command("training.evaluate", f"evaluate.checkpoint={checkpoint}", f"hydra.run.dir={tmp_path / 'e'}")
    assert rc == 0, text[-3000:]
    assert (tmp_path / "e" / "skill.md").exists()
    init = str(ZarrDataset(store).dates[20])
    two_ranks = ["strategy=shard_sequence", "trainer.nprocs=2", "trainer.ranks_per_model=2"]
    rc, text = command(
        "training.predict",
        f"predict.checkpoint={checkpoint}",
        f"predict.initial_dates=[{init}]",
        "predict.steps=1",
        f"predict.output={tmp_path / 'forecasts'}",
        f"hydra.run.dir={tmp_path / 'p'}",
        *two_ranks,  # the model split over two ranks, each writing its share
    )
    assert rc == 0, text[-3000:]
    (path,) = (tmp_path / "forecasts").glob("forecast_*.zarr")
    _assert_in_source_order(path, zarr.open_group(str(store), mode="r"), 20)
    rc, text = command("training.evaluate", f"evaluate.checkpoint={checkpoint}", "model.num_channels=8")
    assert rc == EXIT_USER_ERROR, text[-3000:]
    assert "error: model.num_channels = 8 on the command line, but checkpoint" in text
    assert not (tmp_path / "default-data").exists()
