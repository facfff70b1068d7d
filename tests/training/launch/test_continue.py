"""Runs that continue: under another strategy and rank count, in the same MLflow run, with the
whole history; ``stop_at_step`` that is already reached trains nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.reporting.metrics_file import read_history

QUIET = ("evaluate.at_end_of_training=false",)
ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")  # in this process: logs reach caplog


@pytest.mark.slow
def test_resume_under_another_strategy_and_rank_count_continues_the_mlflow_run(tmp_path, small_dataset, caplog):
    first = run(small_config(tmp_path, small_dataset, "trainer.stop_at_step=3", *QUIET))
    assert [s for s, _ in first["history"]] == [0, 1, 2]
    with caplog.at_level(logging.WARNING):
        second = run(small_config(tmp_path, small_dataset, *ONE_RANK, *QUIET))
    assert second["start_step"] == 3 and [s for s, _ in second["history"]] == [3, 4, 5]
    assert "strategy = shard_sequence in the checkpoint, none in this run" in caplog.text
    assert second["run_id"] == first["run_id"]  # the same MLflow run continues

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    losses = client.get_metric_history(first["run_id"], "train/loss")
    assert sorted(m.step for m in losses) == list(range(6))
    recorded = {m.step: m.value for m in losses}
    for step, metrics in [*first["history"], *second["history"]]:
        np.testing.assert_allclose(recorded[step], metrics["train/loss"], rtol=1e-12)
    tags = client.get_run(first["run_id"]).data.tags
    assert "3" in tags["resumed_from_steps"].split(",")
    assert any("strategy.name" in v for k, v in tags.items() if k.startswith("resume.")), tags
    assert [s for s, _ in read_history(tmp_path)] == list(range(6))  # what the final plots draw
    assert load_checkpoint(tmp_path / "checkpoints" / "latest.pt")["step"] == 6


def test_stop_at_step_already_reached_trains_nothing(tmp_path, small_dataset, caplog):
    run(small_config(tmp_path, small_dataset, "trainer.stop_at_step=2", *ONE_RANK, *QUIET))
    before = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    for _ in range(2):
        with caplog.at_level(logging.INFO):
            again = run(small_config(tmp_path, small_dataset, "trainer.stop_at_step=2", *ONE_RANK, *QUIET))
        assert again["history"] == [] and again["start_step"] == 2
    assert "trainer.stop_at_step = 2: the checkpoint" in caplog.text and "nothing to train" in caplog.text
    after = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    assert after["step"] == 2
    for name, value in before["model"].items():
        assert np.array_equal(after["model"][name].numpy(), value.numpy()), name
