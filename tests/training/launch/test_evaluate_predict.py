"""Skill by lead time at the end of a run and from ``python -m training.evaluate``; forecasts
to anemoi-layout stores from ``python -m training.predict``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.training.conftest import PICTURES, small_config
from training import evaluate, predict
from training.checkpoint.files import CheckpointError, load_training_checkpoint
from training.config.schema import RunConfig
from training.config.settings import from_settings
from training.data import DatasetError, ZarrDataset
from training.model.build import build_model
from training.skill.calibration import UNCALIBRATED
from training.skill.fitted import FITTED
from training.skill.scores import KINDS

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


@pytest.fixture
def trained(trained_run):
    return trained_run  # shared with the app's tests (tests/training/conftest.py)


def test_a_run_ends_with_skill_by_lead_time_in_mlflow(trained):
    run_dir, result = trained
    table = result["skill"]
    assert table.lead_hours == [6.0, 12.0] and set(table.kinds) == {*KINDS, *FITTED, UNCALIBRATED}
    for kind in table.kinds:
        assert all(np.isfinite(table.rmse(kind, "tracer")))
    # a row per variable's table, and one in the tracer's centroid table
    assert (run_dir / "skill.md").read_text().count("| 12 |") == len(table.variables) + 1
    assert table.centroids.variable == "tracer" and all(np.isfinite(table.centroids.error_km["model"]))
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    for k, lead in enumerate(("006h", "012h")):  # the lead in the name, the model's training step as the step
        history = client.get_metric_history(result["run_id"], f"eval/rmse/tracer/model/{lead}")
        assert [(m.step, m.value) for m in history] == [(6, pytest.approx(table.rmse("model", "tracer")[k]))]
    artifacts = {a.path for a in client.list_artifacts(result["run_id"])}
    assert {"rmse_by_lead.png", "skill.csv", "skill.md", "loss_curve.png"} <= artifacts


def test_evaluate_a_checkpoint_on_other_ranks_gives_the_same_table(trained, tmp_path, small_dataset):
    run_dir, result = trained
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    cfg = small_config(tmp_path, small_dataset, *ONE_RANK, f"evaluate.checkpoint={checkpoint}", PICTURES)
    out = evaluate.run(cfg)
    assert out["checkpoint_step"] == 6
    for want, got in zip(result["skill"].rows, out["skill"].rows):
        assert want[:3] == got[:3]
        np.testing.assert_allclose(got.rmse, want.rmse, rtol=1e-5)
        np.testing.assert_allclose(got.acc, want.acc, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "rmse_by_lead.png").exists()
    uncalibrated = evaluate.run(
        small_config(
            tmp_path / "raw", small_dataset, *ONE_RANK, f"evaluate.checkpoint={checkpoint}", "evaluate.calibrate=false"
        )
    )
    raw = uncalibrated["skill"]
    assert UNCALIBRATED not in raw.kinds
    np.testing.assert_allclose(raw.rmse("model", "tracer"), result["skill"].rmse(UNCALIBRATED, "tracer"), rtol=1e-5)
    assert not np.allclose(raw.rmse("model", "tracer"), result["skill"].rmse("model", "tracer"), rtol=1e-5)
    # logged beside the run it evaluates, naming it
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    tags = client.get_run(out["run_id"]).data.tags
    assert tags["source_run_id"] == result["run_id"] and tags["kind"] == "evaluation"
    history = client.get_metric_history(out["run_id"], "eval/rmse/tracer/model/012h")
    assert [(m.step, m.value) for m in history] == [(6, pytest.approx(out["skill"].rmse("model", "tracer")[1]))]


def test_evaluate_refuses_a_missing_checkpoint_and_too_many_steps(trained, tmp_path, small_dataset):
    run_dir, _ = trained
    with pytest.raises(CheckpointError, match="evaluate.checkpoint: no checkpoint at"):
        evaluate.run(small_config(tmp_path, small_dataset, *ONE_RANK, f"evaluate.checkpoint={tmp_path / 'x.pt'}"))
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    with pytest.raises(DatasetError, match="evaluate.steps = 30"):
        evaluate.run(
            small_config(tmp_path, small_dataset, *ONE_RANK, f"evaluate.checkpoint={checkpoint}", "evaluate.steps=30")
        )


def test_predict_writes_forecasts_that_the_reader_opens(trained, tmp_path, small_dataset):
    run_dir, _ = trained
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    source = ZarrDataset(small_dataset)
    init = str(source.dates[30])
    cfg = small_config(
        tmp_path,
        small_dataset,
        f"predict.checkpoint={checkpoint}",
        f"predict.initial_dates=[{init}]",
        "predict.steps=2",
        f"predict.output={tmp_path / 'forecasts'}",
    )
    (path,) = predict.run(cfg)
    store = ZarrDataset(path)
    assert store.variables == source.variables and store.n_times == 3
    assert list(store.dates) == [source.dates[30] + np.timedelta64(6 * k, "h") for k in range(3)]
    np.testing.assert_allclose(store.latitudes, source.latitudes)
    np.testing.assert_allclose(store.state(0), source.state(30), rtol=1e-5, atol=1e-5)  # the initial state

    state, saved = load_training_checkpoint(checkpoint)
    from processor.grids import get_grid
    from training.model import ShardedGrids

    grids = ShardedGrids.build(source.latitudes, source.longitudes, get_grid("o8"), 1, 0, 4, 3)
    model = build_model(from_settings(RunConfig, saved), source.roles, grids)
    model.load_state_dict(state["model"])
    with torch.no_grad():
        one = model.eval()(torch.from_numpy(source.state(30))[None], grids, None)[0].numpy()
    np.testing.assert_allclose(store.state(1), one, rtol=1e-4, atol=1e-4)  # written by 2 ranks
    with pytest.raises(RuntimeError, match="FileExistsError: .* a forecast store is never overwritten"):
        predict.run(cfg)  # never overwrites (the app prints this one line)


def test_predict_interrupted_removes_the_forecast_it_was_writing(trained, tmp_path, small_dataset, monkeypatch):
    """A half-written store would make the next run refuse its date: Ctrl-C removes it."""
    run_dir, _ = trained
    source = ZarrDataset(small_dataset)
    output = tmp_path / "forecasts"
    cfg = small_config(
        tmp_path,
        small_dataset,
        *ONE_RANK,
        f"predict.checkpoint={run_dir / 'checkpoints' / 'latest.pt'}",
        f"predict.initial_dates=[{source.dates[30]}]",
        f"predict.output={output}",
    )

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(predict, "rollout", interrupted)
    with pytest.raises(KeyboardInterrupt):
        predict.run(cfg)
    assert output.exists() and not list(output.iterdir())
