"""NaN and inf: in the dataset they are reported before training; in the loss they stop the run,
keep the last good checkpoint and mark the MLflow run as failed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr
from mlflow.tracking import MlflowClient

from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.data import DatasetError, ZarrDataset
from training.data.generate import VARIABLES
from training.loop.trainer import sample_positions


def _poison(store, t: int, variable: int, point: int, value: float) -> None:
    zarr.open_group(str(store), mode="a")["data"][t, variable, 0, point] = value


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nonfinite_data_is_reported_before_training(tmp_path, small_dataset, value):
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    _poison(store, 7, 2, 123, value)
    with pytest.raises(DatasetError) as info:
        run(small_config(tmp_path, store))
    message = str(info.value)
    assert f"variable {VARIABLES[2]!r}, date 2020-01-02T18:00:00 (index 7), point 123" in message, message
    assert not (tmp_path / "checkpoints").exists()


def _first_unseen_time(n_train: int) -> tuple[int, int]:
    """A step >= 3 and a date that it reads (as input or target) but no earlier step does."""
    seen: set[int] = set()
    for step in range(6):
        (t,) = sample_positions(step, 0, 1, 1, n_train, seed=0)
        if step >= 3:
            for candidate in (t, t + 1):
                if candidate not in seen:
                    return step, candidate
        seen |= {t, t + 1}
    raise AssertionError("no such step")


@pytest.mark.slow
def test_nan_loss_stops_keeps_the_last_good_checkpoint_and_tells_mlflow(tmp_path, small_dataset):
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    n_val = 4  # max(2, int(40 dates * val_fraction 0.1))
    step, t = _first_unseen_time(40 - n_val - 1)
    _poison(store, t, 0, 500, np.nan)
    settings = ("data.check_finite=false", "trainer.timeout_s=30", "data.val_fraction=0.1")  # n_val as above
    cfg = small_config(tmp_path / "run", store, *settings)

    with pytest.raises(RuntimeError) as info:
        run(cfg)  # two ranks, both must stop
    report = str(info.value)
    for r in (0, 1):
        expected = f"rank {r}: FloatingPointError: loss is nan at step {step}: stopping. The last good checkpoint"
        expected += " (step 3)"
        assert expected in report, report

    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt")["step"] == 3
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1] == {"step": step, "train/nonfinite_loss": 1.0}

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    (mlrun,) = client.search_runs([client.get_experiment_by_name("gridshard").experiment_id])
    assert mlrun.info.status == "FAILED"
    assert f"loss is nan at step {step}" in mlrun.data.tags["failure_reason"]
    assert [m.step for m in client.get_metric_history(mlrun.info.run_id, "train/nonfinite_loss")] == [step]
    assert len(client.get_metric_history(mlrun.info.run_id, "train/loss")) == step


def test_the_scan_is_chunked_and_finds_the_exact_place(tmp_path, small_dataset):
    """A store chunked by 4 dates x 400 points, read in blocks of one chunk: the block arithmetic
    must still name the right date and point (here in the last block of both axes)."""
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    root = zarr.open_group(str(store), mode="a")
    data = root["data"][:]
    del root["data"]
    root.create_array("data", shape=data.shape, chunks=(4, data.shape[1], 1, 400), dtype="float32")[:] = data
    _poison(store, 37, 1, 1234, np.inf)
    place = r"variable 'zeta', date 2020-01-10T06:00:00 \(index 37\), point 1234 \(1 non-finite values in date indices"
    dataset = ZarrDataset(store)
    with pytest.raises(DatasetError, match=place + " 0..39"):
        dataset.check_finite()  # one block: the whole store
    with pytest.raises(DatasetError, match=place + " 36..39"):
        dataset.check_finite(block_bytes=1)  # one chunk per block
