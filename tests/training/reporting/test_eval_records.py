"""Evaluations are records tied to the training step of the model they scored: in MLflow each
score is a metric with its lead in the name, logged at that step, so that a resumed run's final
evaluation is the latest value of every metric (not the stopped model's, kept by the resume's
deduplication); in the run directory they are ``evaluations.jsonl``, apart from the training
steps of ``metrics.jsonl``. And the experiment opens in MLflow 3's model-training view.

The :class:`Tracker` is used directly, as a run's segments would (see ``test_run_lifecycle``).
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from training.reporting.metrics_file import EVALUATIONS, read_evaluations, read_history
from training.reporting.mlflow_store import EXPERIMENT_KIND, local_store_uri
from training.reporting.report import report_skill
from training.reporting.tracking import Tracker
from training.skill.scores import SkillRow, SkillTable, lead_labels

LEADS = [6.0, 12.0, 24.0, 48.0]
VARIABLES = ["psi", "tracer"]
KINDS = ["model", "persistence", "climatology"]


def _table(seed: int) -> SkillTable:
    """A skill table of made-up scores (climatology has no ACC, as in a real one)."""
    rng = np.random.default_rng(seed)
    rows = [
        SkillRow(
            kind,
            var,
            lead,
            float(rng.uniform(1e-3, 1e-2)),
            math.nan if kind == "climatology" else float(rng.uniform()),
            4,
        )
        for kind in KINDS
        for var in VARIABLES
        for lead in LEADS
    ]
    return SkillTable(rows)


def _segment(run_dir: Path, steps: range, start: int, resume: bool = True) -> Tracker:
    tracker = Tracker(run_dir, None, "gridshard", None, {"p": "1"}, {}, resume=resume, start_step=start)
    for step in steps:
        tracker.log_metrics(step, {"train/loss": 1.0 / (step + 1)})
    return tracker


def _finish(tracker: Tracker) -> None:
    """End the segment; MLflow must have taken everything (no fall-back, which would replay)."""
    tracker.finish()
    assert not tracker.fallback and tracker.client is not None


def _csv_metrics(path: Path) -> dict[str, float]:
    """``skill.csv`` as the metric names MLflow should hold, with the values the file holds."""
    labels = lead_labels(LEADS)
    out = {}
    rows = list(csv.DictReader(path.open()))
    for row in rows:
        lead = labels[float(row["lead_h"])]
        for name in ("rmse", "acc"):
            if math.isfinite(float(row[name])):
                out[f"eval/{name}/{row['variable']}/{row['kind']}/{lead}"] = float(row[name])
    for var in VARIABLES:
        for lead in LEADS:
            rmse = {r["kind"]: float(r["rmse"]) for r in rows if r["variable"] == var and float(r["lead_h"]) == lead}
            out[f"eval/rmse/{var}/model_over_persistence/{labels[lead]}"] = rmse["model"] / rmse["persistence"]
    return out


def _eval_metrics(client: MlflowClient, run_id: str) -> dict[str, float]:
    return {k: v for k, v in client.get_run(run_id).data.metrics.items() if k.startswith("eval/")}


def test_a_resumed_runs_final_evaluation_is_the_latest_value_in_mlflow(tmp_path):
    """Stopped at step 30 and evaluated there; resumed from that checkpoint, trained to step 60,
    evaluated again: MLflow's latest value of every eval metric is the step-60 table's."""
    first = _segment(tmp_path, range(0, 30), 0, resume=False)
    report_skill(_table(30), tmp_path, first, model_step=30)
    _finish(first)
    stopped = _csv_metrics(tmp_path / "skill.csv")

    second = _segment(tmp_path, range(30, 60), 30)
    report_skill(_table(60), tmp_path, second, model_step=60)
    _finish(second)
    final = _csv_metrics(tmp_path / "skill.csv")
    assert second.run_id == first.run_id

    client = MlflowClient(local_store_uri(tmp_path))
    latest = _eval_metrics(client, first.run_id)
    assert latest.keys() == final.keys() and "eval/rmse/psi/model/024h" in latest
    for key, value in final.items():
        assert latest[key] == pytest.approx(value, rel=1e-9, abs=0), key
        assert value != stopped[key]
    for key in latest:  # each metric: one value per evaluation, at the training step of its model
        history = sorted((m.step, m.value) for m in client.get_metric_history(first.run_id, key))
        assert [s for s, _ in history] == [30, 60], key
        assert history[0][1] == pytest.approx(stopped[key], rel=1e-9, abs=0)
        assert not {s for s, _ in history} & {int(h) for h in LEADS}  # never a lead hour as the step

    assert [s for s, _ in read_history(tmp_path)] == list(range(60))  # training steps only
    assert all(set(m) == {"train/loss"} for _, m in read_history(tmp_path))
    evaluations = read_evaluations(tmp_path)
    assert [s for s, _ in evaluations] == [30, 60]
    assert evaluations[1][1] == _table(60).metrics()  # floats round-trip through JSON
    assert "Model after training step 60." in (tmp_path / "skill.md").read_text()


@pytest.mark.slow
def test_an_evaluation_never_delivered_is_replayed_and_one_made_again_is_the_latest(tmp_path):
    """Rank 0 killed after writing the step-30 evaluation to evaluations.jsonl, before MLflow got
    it: the segment resumed at step 30 replays it at step 30. Evaluated again at step 60 (other
    ``evaluate`` settings, say) after a resume at 60: the new values are the latest, and the
    step-60 evaluation already in MLflow is not replayed a second time."""
    first = _segment(tmp_path, range(0, 30), 0, resume=False)
    _finish(first)
    undelivered = _table(30).metrics()
    with open(tmp_path / EVALUATIONS, "a") as f:
        f.write(json.dumps({"step": 30, **undelivered}) + "\n")
        f.write(json.dumps({"step": 40, **_table(40).metrics()}) + "\n")  # a model trained again
        f.write('{"step": 60, "eval/rm')  # cut short by the kill

    second = _segment(tmp_path, range(30, 60), 30)
    report_skill(_table(60), tmp_path, second, model_step=60)
    _finish(second)
    third = _segment(tmp_path, range(0), 60)
    report_skill(_table(61), tmp_path, third, model_step=60)
    _finish(third)

    client = MlflowClient(local_store_uri(tmp_path))
    key = "eval/rmse/tracer/model/048h"
    history = [(m.step, m.value) for m in client.get_metric_history(first.run_id, key)]
    again = _table(61).metrics()
    assert sorted(history) == sorted([(30, undelivered[key]), (60, _table(60).metrics()[key]), (60, again[key])])
    assert _eval_metrics(client, first.run_id) == pytest.approx(again, rel=1e-9, abs=0)
    assert [s for s, _ in read_evaluations(tmp_path)] == [30, 60, 60]


def test_lead_labels_sort_by_lead():
    assert lead_labels([6.0, 12.0, 24.0, 240.0]) == {6.0: "006h", 12.0: "012h", 24.0: "024h", 240.0: "240h"}
    assert lead_labels([0.5, 1.0]) == {0.5: "000.50h", 1.0: "001.00h"}


def _experiment(client: MlflowClient, name: str):
    return client.get_experiment_by_name(name)


def test_the_experiment_is_a_model_training_one(tmp_path):
    key, value = EXPERIMENT_KIND
    assert (key, value) == ("mlflow.experimentKind", "custom_model_development")
    tracker = _segment(tmp_path, range(2), 0, resume=False)
    _finish(tracker)
    client = MlflowClient(local_store_uri(tmp_path))
    assert _experiment(client, "gridshard").tags[key] == value

    # An experiment made before (without the tag) gets it, on a new run and on a resumed one;
    # a kind a person chose stays.
    client.delete_experiment_tag(_experiment(client, "gridshard").experiment_id, key)
    resumed = _segment(tmp_path, range(2, 3), 2)
    _finish(resumed)
    assert _experiment(client, "gridshard").tags[key] == value
    client.create_experiment("chosen", tags={key: "genai_development"})
    (tmp_path / "other").mkdir()
    other = Tracker(tmp_path / "other", local_store_uri(tmp_path), "chosen", None, {}, {})
    _finish(other)
    assert _experiment(client, "chosen").tags[key] == "genai_development"


@pytest.mark.slow
def test_a_killed_runs_evaluation_file_is_cut_back_on_resume(tmp_path):
    """Evaluations of models after the checkpoint a segment resumes from are of models trained
    again: the segment drops them from evaluations.jsonl; those up to it stay."""
    (tmp_path / EVALUATIONS).write_text(
        "".join(json.dumps({"step": s, "eval/rmse/a/model/006h": float(s)}) + "\n" for s in (10, 20, 30))
    )
    tracker = _segment(tmp_path, range(20, 22), 20)
    deadline = time.monotonic() + 60
    while tracker.run_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _finish(tracker)
    assert [s for s, _ in read_evaluations(tmp_path)] == [10, 20]
