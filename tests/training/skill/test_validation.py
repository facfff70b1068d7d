"""Validation in physical units during training: the model's RMSE at the first lead beside the
best baseline's, in the progress bar, metrics.jsonl and MLflow, equal to what the evaluation
(:func:`training.skill.by_lead.evaluate_skill`) reports for the same samples; the same under
model and data parallelism."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
import zarr
from mlflow.tracking import MlflowClient

from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.best import BestOnValidation
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.loop.trainer import Trainer, progress_fields
from training.session import open_session
from training.skill.by_lead import evaluate_skill
from training.skill.calibration import UNCALIBRATED
from training.skill.fitted import FITTED

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def _validations(run_dir) -> list[dict[str, float]]:
    """The records of metrics.jsonl that hold a validation."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "val/loss" in r]


def test_validation_rmse_equals_the_evaluations_and_shows_in_the_progress_bar(tmp_path, small_dataset):
    store = shutil.copytree(small_dataset, tmp_path / "store.zarr")
    zarr.open_group(str(store), mode="a").attrs["units"] = {"psi": "m2 s-1"}
    cfg = prepare(small_config(tmp_path / "run", store, *ONE_RANK, "logging.mlflow=false", "trainer.val_batches=50"))
    session = open_session(cfg, ParallelDims.build(1))
    trainer = Trainer(session)
    metrics = trainer.validator.validate()
    val = session.samples.val
    assert trainer.validator.skill.samples == val  # 50 batches of 1: every validation sample
    table = evaluate_skill(session, 1, len(val))  # every validation sample, one lead
    outputs = session.dataset.roles.outputs
    assert outputs[0] == "psi" and len(outputs) > 1
    baselines = ("persistence", "climatology", "hourly_climatology", "anomaly_persistence", *FITTED)
    for v in outputs:
        # validation scores the model's own forecast, the evaluation also its calibration
        assert metrics[f"val/rmse/{v}/model"] == pytest.approx(table.rmse(UNCALIBRATED, v)[0], rel=1e-5)
        best = min(table.rmse(k, v)[0] for k in baselines)
        assert metrics[f"val/rmse/{v}/best_baseline"] == pytest.approx(best, rel=1e-12)
        assert trainer.validator.skill.best[v] == min(baselines, key=lambda k, v=v: table.rmse(k, v)[0])
    shown = progress_fields({"train/loss": 0.5, "samples_per_s": 3.0}, trainer.validator, BestOnValidation())
    psi = metrics["val/rmse/psi/model"], metrics["val/rmse/psi/best_baseline"]
    assert shown["psi_rmse"] == f"{psi[0]:.3g} m2 s-1"
    assert shown["baseline"] == f"{psi[1]:.3g} ({trainer.validator.skill.best['psi']})"
    assert list(shown) == ["loss", "val", "psi_rmse", "baseline", "samples/s"]
    again = trainer.validator.validate()  # the same model: the same scores (the sums start afresh)
    assert again == pytest.approx(metrics, rel=1e-12)


def test_validation_loss_is_over_the_rollout_the_run_trains_and_its_rmse_at_the_first_lead(tmp_path, small_dataset):
    """With ``trainer.rollout.max = 2`` the best model is chosen on two-step forecasts: the loss
    of both steps (each fed the one before), not of the first alone."""
    # batches of 3: the validation samples are not a multiple of 3, the last batch is short
    rollout = (
        "trainer.rollout.max=2",
        "trainer.rollout.increase_every=3",
        "trainer.val_batches=50",
        "trainer.batch_size=3",
    )
    cfg = prepare(small_config(tmp_path / "run", small_dataset, *ONE_RANK, "logging.mlflow=false", *rollout))
    session = open_session(cfg, ParallelDims.build(1), horizon=2)  # as the training run opens it
    trainer = Trainer(session)
    metrics = trainer.validator.validate()
    val, loss = session.samples.val, trainer.step_fn.loss
    assert len(val) % 3 and trainer.validator.rollout == 2
    session.model.eval()
    with torch.no_grad():
        by_steps = {
            steps: 3  # one sample a batch: its loss is over a third of a batch's points
            * np.mean(
                [
                    loss(b.x, b.targets, session.grids, session.model_group, session.transport, b.forcings).item()
                    for b in (session.batches([v], steps) for v in val)
                ]
            )
            for steps in (1, 2)
        }
    assert metrics["val/loss"] == pytest.approx(by_steps[2], rel=1e-5) and metrics["val/rollout"] == 2
    assert abs(by_steps[2] - by_steps[1]) > 1e-3 * by_steps[1]  # a rollout's loss is not the first step's
    cfg.trainer.rollout.increase_every = 0  # never raised: the run trains, and validates, one step
    one_step = trainer.validator.validate()
    assert one_step["val/loss"] == pytest.approx(by_steps[1], rel=1e-5) and one_step["val/rollout"] == 1
    rmse = [k for k in metrics if k.startswith("val/rmse/") and k.endswith("/model")]
    assert len(rmse) == len(session.dataset.roles.outputs)
    assert {k: metrics[k] for k in rmse} == pytest.approx({k: one_step[k] for k in rmse}, rel=1e-6)


def test_a_run_logs_validation_rmse_to_metrics_jsonl_and_mlflow(tmp_path, small_dataset):
    result = run(small_config(tmp_path, small_dataset, *ONE_RANK))
    validations = _validations(tmp_path)
    assert [r["step"] for r in validations] == [2, 5]  # trainer.val_interval = 3, 6 steps
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    for v in ("psi", "tracer"):
        for name in (f"val/rmse/{v}/model", f"val/rmse/{v}/best_baseline"):
            assert all(math.isfinite(r[name]) and r[name] > 0 for r in validations), name
            logged = client.get_metric_history(result["run_id"], name)
            assert sorted((m.step, m.value) for m in logged) == [
                (r["step"], pytest.approx(r[name])) for r in validations
            ]
    first, last = validations
    assert first["val/rmse/psi/best_baseline"] == last["val/rmse/psi/best_baseline"]  # the baselines: once


def _validated(result: dict) -> list[tuple[int, dict[str, float]]]:
    """The steps of a run's history that validated, with their ``val/rmse/...`` metrics."""
    return [
        (step, {k: v for k, v in m.items() if k.startswith("val/rmse/")})
        for step, m in result["history"]
        if "val/loss" in m
    ]


def _assert_same(got: list, expected: list) -> None:
    """The same steps and metrics: the baselines' to round-off, the model's as the strategies' losses."""
    assert [step for step, _ in got] == [step for step, _ in expected]
    for (_, mine), (_, theirs) in zip(got, expected):
        assert mine.keys() == theirs.keys() and "val/rmse/psi/model" in mine
        for name, value in theirs.items():
            rel = 1e-12 if name.endswith("best_baseline") else 1e-4
            assert mine[name] == pytest.approx(value, rel=rel), name


@pytest.mark.slow
def test_validation_rmse_is_the_same_under_model_and_data_parallelism(trained_run, tmp_path, small_dataset):
    """Two ranks holding a block of points each (the shared run: shard_sequence) against one rank;
    two replicas of a sample each (both validate the same 2 samples) against one rank with
    batches of 2."""
    _, sharded = trained_run
    one = run(small_config(tmp_path / "one", small_dataset, *ONE_RANK, "logging.mlflow=false"))
    _assert_same(_validated(sharded), _validated(one))
    two_replicas = ("strategy=none", "trainer.ranks_per_model=1", "trainer.val_batches=2", "logging.mlflow=false")
    replicas = run(small_config(tmp_path / "replicas", small_dataset, *two_replicas))
    batch_of_2 = ("trainer.batch_size=2", "trainer.val_batches=1", "logging.mlflow=false")
    one_batch_of_2 = run(small_config(tmp_path / "one2", small_dataset, *ONE_RANK, *batch_of_2))
    _assert_same(_validated(replicas), _validated(one_batch_of_2))
