"""The run's own record is written whatever ``logging.mlflow`` says: with MLflow off, rank 0
still writes ``metrics.jsonl`` (a line per step), ``evaluations.jsonl`` and the loss curve."""

from __future__ import annotations

import json

from tests.training.conftest import PICTURES, small_config
from training.app import run
from training.reporting.metrics_file import RunRecord, read_evaluations, read_history

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def test_a_run_with_mlflow_off_keeps_its_record(tmp_path, small_dataset):
    result = run(small_config(tmp_path, small_dataset, *ONE_RANK, "logging.mlflow=false", PICTURES))
    assert result["run_id"] is None
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlflow_run.json").exists()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [step for step, _ in result["history"]]
    assert [step for step, _ in read_history(tmp_path)] == list(range(6))
    evaluations = read_evaluations(tmp_path)
    assert [step for step, _ in evaluations] == [6]  # the model after the last step, scored once
    assert any(name.startswith("eval/rmse/psi/model/") for name in evaluations[0][1])
    for picture in ("loss_curve.png", "forecast_map.png", "rmse_by_lead.png"):
        assert (tmp_path / picture).stat().st_size > 0, picture


def test_a_run_with_plots_off_writes_its_tables_and_no_picture(tmp_path, small_dataset):
    run(small_config(tmp_path, small_dataset, *ONE_RANK, "logging.mlflow=false", "logging.plots=false"))
    assert (tmp_path / "skill.md").exists() and (tmp_path / "skill.csv").exists()
    assert [step for step, _ in read_evaluations(tmp_path)] == [6]
    assert not list(tmp_path.glob("*.png"))


def test_a_resumed_record_keeps_the_earlier_steps_once(tmp_path):
    first = RunRecord(tmp_path)
    for step in range(5):
        first.log_metrics(step, {"train/loss": float(step)})
    first.log_evaluation(4, {"eval/rmse/psi/model/006h": 1.0})
    first.close()
    resumed = RunRecord(tmp_path, start_step=3)  # its checkpoint: after step 2
    assert resumed.earlier == [(s, {"train/loss": float(s)}) for s in range(3)]
    resumed.log_metrics(3, {"train/loss": 30.0})
    resumed.close()
    assert read_history(tmp_path) == [*((s, {"train/loss": float(s)}) for s in range(3)), (3, {"train/loss": 30.0})]
    assert read_evaluations(tmp_path) == []  # the model of step 4 is trained again
