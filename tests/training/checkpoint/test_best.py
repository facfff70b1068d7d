"""The best model on validation: kept as best.pt, scored at the end of the run, and the run
stopped by ``trainer.patience`` or ``trainer.time_budget_min``, resumed with the same best."""

import math

import numpy as np
import pytest

from tests.training.conftest import small_config
from training import evaluate
from training.app import run
from training.checkpoint.best import BestOnValidation
from training.checkpoint.files import BEST, LATEST, load_checkpoint
from training.skill.validation import Validator

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def test_the_best_is_the_lowest_loss_and_patience_counts_the_validations_since():
    best = BestOnValidation()
    assert not best.out_of_patience(1)  # nothing validated yet
    assert best.update(3, 0.5) and best.update(6, 0.4)
    assert not best.update(9, 0.4) and not best.update(12, math.nan)  # equal or NaN: not better
    assert (best.step, best.loss, best.stale) == (6, 0.4, 2)
    assert best.out_of_patience(2) and not best.out_of_patience(3) and not best.out_of_patience(None)
    assert BestOnValidation.from_record(best.record()) == best
    assert BestOnValidation.from_record(None) == BestOnValidation()  # a checkpoint from before


def test_a_loss_over_other_rollout_steps_starts_the_best_afresh():
    """A run resumed with another ``trainer.rollout.max`` validates over other steps: its losses
    do not compare with the best's (a one-step best of 0.2 would never be beaten by 3 steps' 0.5)."""
    best = BestOnValidation.from_record({"loss": 0.2, "step": 600, "stale": 1})  # written before: one step
    assert best.rollout == 1
    assert best.update(650, 0.5, rollout=3)
    assert (best.step, best.loss, best.stale, best.rollout) == (650, 0.5, 0, 3)
    assert not best.update(700, 0.6, rollout=3) and best.stale == 1
    assert best.update(750, 0.9, rollout=3, step_decay=0.5)  # other weights of the same steps
    assert (best.step, best.loss, best.step_decay) == (750, 0.9, 0.5)
    assert not best.update(800, 0.95, rollout=3, step_decay=0.5)


@pytest.fixture
def scripted_validation(monkeypatch):
    """Validations whose losses are 1.0, 2.0, 3.0, ... in turn: the first model is the best."""
    validate, count = Validator.validate, iter(range(1, 100))

    def scripted(self):
        return validate(self) | {"val/loss": float(next(count))}

    monkeypatch.setattr(Validator, "validate", scripted)


def test_patience_stops_the_run_and_the_best_model_is_scored(tmp_path, small_dataset, scripted_validation):
    run_dir = tmp_path / "run"
    settings = (*ONE_RANK, "trainer.steps=12", "trainer.patience=2", "trainer.checkpoint_interval=100")
    result = run(small_config(run_dir, small_dataset, *settings))
    # validations after steps 3 (best), 6 and 9 (not better: patience spent) -> stopped after 9
    assert result["stopped"] == "patience" and result["end_step"] == 9 and result["best_step"] == 3
    checkpoints = run_dir / "checkpoints"
    assert load_checkpoint(checkpoints / BEST)["step"] == 3
    latest = load_checkpoint(checkpoints / LATEST)
    assert latest["step"] == 9 and latest["records"]["best_validation"] == {
        "loss": 1.0,
        "step": 3,
        "stale": 2,
        "rollout": 1,
        "step_decay": 1.0,
    }
    assert "Model after training step 3." in (run_dir / "skill.md").read_text()

    # the table scored at the end is best.pt's, not the last model's
    scored = evaluate.run(
        small_config(tmp_path / "eval", small_dataset, *ONE_RANK, f"evaluate.checkpoint={checkpoints / BEST}")
    )
    assert scored["checkpoint_step"] == 3
    for want, got in zip(result["skill"].rows, scored["skill"].rows):
        np.testing.assert_allclose(got.rmse, want.rmse, rtol=1e-5)
    last = evaluate.run(
        small_config(tmp_path / "last", small_dataset, *ONE_RANK, f"evaluate.checkpoint={checkpoints / LATEST}")
    )
    assert last["skill"].rmse("model", "tracer") != pytest.approx(result["skill"].rmse("model", "tracer"))

    # resumed, the run knows it is out of patience
    again = run(small_config(run_dir, small_dataset, *settings))
    assert again["history"] == [] and "trainer.patience = 2" in again["reason"]


def test_a_stopped_run_resumes_with_its_best(tmp_path, small_dataset, scripted_validation):
    run_dir = tmp_path / "run"
    settings = (*ONE_RANK, "trainer.steps=9", "trainer.patience=5", "evaluate.at_end_of_training=false")
    run(small_config(run_dir, small_dataset, *settings, "trainer.stop_at_step=6"))
    resumed = run(small_config(run_dir, small_dataset, *settings))
    assert resumed["start_step"] == 6 and resumed["best_step"] == 3  # validations after 3, 6, 9: 1.0 stays best
    assert load_checkpoint(run_dir / "checkpoints" / LATEST)["records"]["best_validation"]["stale"] == 2


def test_a_time_budget_stops_the_run_and_evaluates_it(tmp_path, small_dataset):
    run_dir = tmp_path / "run"
    result = run(small_config(run_dir, small_dataset, *ONE_RANK, "trainer.steps=1000", "trainer.time_budget_min=1e-6"))
    assert result["stopped"] == "time_budget" and result["end_step"] == 1 and result["skill"] is not None
    trained_s = load_checkpoint(run_dir / "checkpoints" / LATEST)["records"]["trained_s"]
    assert trained_s > 0
    again = run(small_config(run_dir, small_dataset, *ONE_RANK, "trainer.steps=1000", "trainer.time_budget_min=1e-6"))
    assert again["history"] == [] and "trainer.time_budget_min = 1e-06" in again["reason"]


def test_keep_best_off_scores_the_last_model(tmp_path, small_dataset, scripted_validation):
    run_dir = tmp_path / "run"
    result = run(small_config(run_dir, small_dataset, *ONE_RANK, "trainer.keep_best=false"))
    assert result["best_step"] == 3 and not (run_dir / "checkpoints" / BEST).exists()
    assert "Model after training step 6." in (run_dir / "skill.md").read_text()
