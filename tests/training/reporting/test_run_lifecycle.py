"""Runs that continue, and runs of several processes: a resumed run continues its MLflow run,
``metrics.jsonl`` reads back as one history, torchrun makes one run directory, multirun members
share one MLflow store, and configuration or data errors print one line (the traceback on
``HYDRA_FULL_ERROR=1``).

The app runs for real, in subprocesses, on the small dataset for 2 steps.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from processor.runtime import run_local
from tests.processes import run_in_own_session
from tests.training.conftest import small_overrides
from training.config.schema import schema_keys
from training.data import DatasetError
from training.launch.errors import DEBUG_HINT, EXIT_USER_ERROR, exit_on_user_error, user_error
from training.reporting.metrics_file import read_history
from training.reporting.mlflow_store import RECORD, local_store_uri
from training.reporting.tracking import Tracker

ONE_RANK = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"]
PARAMS = {"strategy.name": "shard_sequence", "trainer.nprocs": "2"}


def _tiny(dataset: Path) -> list[str]:
    """The small overrides for 2 steps, the run directory left to Hydra."""
    overrides = [o for o in small_overrides(Path("."), dataset) if not o.startswith("run_dir=")]
    overrides += ["trainer.steps=2", "trainer.val_interval=1", "trainer.checkpoint_interval=2"]
    if "evaluate.at_end_of_training" in schema_keys():
        overrides.append("evaluate.at_end_of_training=false")
    return overrides


def _launch(args: list[str], cwd: Path, **env: str) -> tuple[int, str, str]:
    """``python <args>`` in its own session (a hang is ended with every worker); rc, stdout, stderr."""
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    environ.update(OMP_NUM_THREADS="1", **env)
    return run_in_own_session([sys.executable, *args], cwd, environ, timeout_s=240)


def _segment(run_dir: Path, steps: range, params: dict[str, str], start: int, resume: bool = True) -> Tracker:
    tags = {"resumed_from_step": str(start)}
    tracker = Tracker(run_dir, None, "gridshard", None, params, tags, resume=resume, start_step=start)
    for step in steps:
        tracker.log_metrics(step, {"train/loss": 1.0 / (step + 1)})
    return tracker


def test_resumed_tracker_continues_the_mlflow_run(tmp_path):
    first = _segment(tmp_path, range(0, 4), PARAMS, 0, resume=False)
    first.finish()
    record = json.loads((tmp_path / RECORD).read_text())
    assert record == {
        "tracking_uri": local_store_uri(tmp_path),
        "experiment_id": "1",
        "run_id": first.run_id,
        "params": PARAMS,
    }

    # Resumed from the checkpoint at step 2 on 4 ranks: steps 2 and 3 run again.
    second = _segment(tmp_path, range(2, 6), {**PARAMS, "trainer.nprocs": "4", "trainer.seed": "1"}, 2)
    client = MlflowClient(local_store_uri(tmp_path))
    deadline = time.monotonic() + 60
    while second.run_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert second.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "RUNNING"
    second.finish()
    third = _segment(tmp_path, range(4, 7), {**PARAMS, "trainer.nprocs": "4", "trainer.seed": "1"}, 4)
    third.finish()

    run = client.get_run(first.run_id)
    assert third.run_id == first.run_id and run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(first.run_id, "train/loss")]
    assert sorted(steps) == list(range(7))  # the steps each segment ran again are not logged twice
    assert [s for s, _ in read_history(tmp_path)] == list(range(7))
    assert run.data.params["trainer.nprocs"] == "2"  # params are immutable: the first value stays
    assert run.data.params["trainer.seed"] == "1"  # a new one is logged
    assert run.data.tags["resume.2.changed"] == "trainer.nprocs: 2 -> 4"
    assert "resume.4.changed" not in run.data.tags  # nothing changed since step 2
    assert run.data.tags["resumed_from_steps"] == "2,4"
    assert len(client.search_runs([record["experiment_id"]])) == 1

    fresh = _segment(tmp_path, range(0, 1), PARAMS, 0, resume=False)  # trainer.resume=false: a new run
    fresh.finish()
    assert fresh.run_id != first.run_id


@pytest.mark.slow
def test_a_recorded_run_that_is_gone_or_elsewhere_gives_a_new_run(tmp_path, caplog):
    first = _segment(tmp_path, range(0, 2), PARAMS, 0, resume=False)
    first.finish()
    MlflowClient(local_store_uri(tmp_path)).delete_run(first.run_id)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    record = {"tracking_uri": "sqlite:////nowhere/mlflow.db", "experiment_id": "1", "run_id": first.run_id}
    (elsewhere / RECORD).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="training.reporting.tracking"):
        gone = _segment(tmp_path, range(2, 4), PARAMS, 2)
        gone.finish()
        moved = _segment(elsewhere, range(2, 4), PARAMS, 2)
        moved.finish()
    assert gone.run_id != first.run_id and moved.run_id != first.run_id
    assert "no longer exists" in caplog.text and "this run logs to" in caplog.text
    assert json.loads((elsewhere / RECORD).read_text())["run_id"] == moved.run_id


def test_a_killed_segment_loses_no_step_and_logs_none_twice(tmp_path):
    """Rank 0 killed at step 6 with steps 3-5 still queued for MLflow (they are in
    metrics.jsonl): the segment resumed from the checkpoint of step 4 replays 3 from the file,
    logs 4 and 5 again (not sent twice, as MLflow has none of them), and goes on."""
    first = _segment(tmp_path, range(0, 3), PARAMS, 0, resume=False)
    first.finish()
    with open(tmp_path / "metrics.jsonl", "a") as f:  # logged, never delivered, then a line cut short
        f.write("".join(json.dumps({"step": s, "train/loss": 1.0 / (s + 1)}) + "\n" for s in (3, 4, 5)))
        f.write('{"step": 6, "train/lo')
    second = _segment(tmp_path, range(4, 8), PARAMS, 4)
    second.finish()
    client = MlflowClient(local_store_uri(tmp_path))
    history = client.get_metric_history(first.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(8))
    assert {m.step: m.value for m in history}[3] == 1.0 / 4
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(8))


def test_read_history_replaces_rerun_steps_key_by_key(tmp_path):
    first = [{"step": 0, "train/loss": 1.0}, {"step": 1, "train/loss": 0.9}, {"step": 2, "train/loss": 0.8}]
    first[-1]["val/loss"] = 0.85
    text = "".join(json.dumps(r) + "\n" for r in first) + '{"step": 3, "train/lo'  # killed mid-line
    (tmp_path / "metrics.jsonl").write_text(text)
    tracker = Tracker(tmp_path, None, "gridshard", None, PARAMS, {}, resume=True)  # resumed at step 2
    tracker.log_metrics(2, {"train/loss": 0.7})
    tracker.log_metrics(3, {"train/loss": 0.6, "val/loss": 0.65})
    tracker.finish()
    assert read_history(tmp_path) == [
        (0, {"train/loss": 1.0}),
        (1, {"train/loss": 0.9}),
        (2, {"train/loss": 0.7, "val/loss": 0.85}),
        (3, {"train/loss": 0.6, "val/loss": 0.65}),
    ]
    assert read_history(tmp_path / "nothing") == []


@pytest.mark.slow
def test_torchrun_makes_one_run_directory(tmp_path, small_dataset):
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "training"]
    rc, out, err = _launch([*torchrun, *_tiny(small_dataset)], tmp_path)
    assert rc == 0, err[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert (run_dir / "checkpoints" / "latest.pt").exists() and (run_dir / RECORD).exists()
    finished = re.findall(r"finished: .*", out + err)
    assert len(finished) == 1 and "MLflow run None" not in finished[0], finished


@pytest.mark.slow
def test_multirun_members_share_one_store(tmp_path, small_dataset):
    sweep = tmp_path / "sweep"
    args = ["-m", "training", "--multirun", *_tiny(small_dataset), *ONE_RANK, "trainer.seed=0,1"]
    rc, _, err = _launch([*args, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert rc == 0, err[-3000:]
    client = MlflowClient(local_store_uri(sweep))
    runs = client.search_runs([client.get_experiment_by_name("gridshard").experiment_id])
    assert sorted(r.data.params["trainer.seed"] for r in runs) == ["0", "1"]
    for run in runs:
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0, 1]
        assert "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    for member in ("0", "1"):
        assert (sweep / member / "metrics.jsonl").exists() and not (sweep / member / "mlflow.db").exists()
        assert json.loads((sweep / member / RECORD).read_text())["tracking_uri"] == local_store_uri(sweep)


@pytest.mark.parametrize(
    "override,line",
    [
        (
            "+trainer.stpes=5",
            "error: config key trainer.stpes is not a setting of the schema: did you mean trainer.steps?",
        ),
        pytest.param(  # the same path as the '+' form's: the slow tier
            "trainer.lr=-1",
            "error: config key trainer.lr = -1.0 is out of range: expected > 0 or null",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_configuration_error_is_one_line(tmp_path, small_dataset, override, line):
    rc, _, err = _launch(["-m", "training", *_tiny(small_dataset), override], tmp_path)
    assert rc == EXIT_USER_ERROR
    assert err.strip().splitlines() == [line, f"({DEBUG_HINT})"], err


@pytest.mark.slow
def test_the_debug_switch_brings_the_traceback_back(tmp_path, small_dataset):
    rc, _, err = _launch(["-m", "training", *_tiny(small_dataset), "trainer.lr=-1"], tmp_path, HYDRA_FULL_ERROR="1")
    assert rc not in (0, EXIT_USER_ERROR)
    assert "Traceback" in err and "ConfigValueError: config key trainer.lr" in err, err


@pytest.mark.slow
def test_a_configuration_error_under_torchrun_is_reported_once(tmp_path, small_dataset):
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "training"]
    rc, out, err = _launch([*torchrun, *_tiny(small_dataset), "trainer.lr=-1"], tmp_path)
    assert rc != 0
    assert re.findall(r"^error: .*", out + err, re.MULTILINE) == [
        "error: config key trainer.lr = -1.0 is out of range: expected > 0 or null"
    ], err[-3000:]
    assert "exitcode  : 2" in err


@pytest.mark.slow
def test_a_data_error_under_torchrun_leaves_no_scratch_behind(tmp_path, small_dataset):
    """torchrun stops the follower with SIGTERM while it waits for rank 0's line: its cleanup never
    runs, so it must have made nothing in the temporary directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "training"]
    rc, out, err = _launch([*torchrun, *_tiny(small_dataset), "data.grid=o8"], tmp_path, TMPDIR=str(scratch))
    assert rc != 0
    assert re.findall(r"^error: data.grid = o8 .*", out + err, re.MULTILINE), err[-3000:]
    assert not list(scratch.glob("gridshard-hydra-*")), sorted(p.name for p in scratch.iterdir())


def _fail_by_rank() -> None:
    """Rank 0 has a bug; rank 1 finds the data wrong (as each rank checks its own data)."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        raise KeyError("a bug")
    raise DatasetError("data.grid = o32 does not fit the store")


def test_an_error_on_a_spawned_rank_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(RuntimeError) as info:
        run_local(_fail_by_rank, 2, timeout_s=30, threads_per_rank=1)
    assert user_error(info.value) == "data.grid = o32 does not fit the store"
    with pytest.raises(SystemExit) as exited:
        exit_on_user_error(info.value)
    assert exited.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == ["error: data.grid = o32 does not fit the store", f"({DEBUG_HINT})"]

    bug_only = RuntimeError("1 of 1 ranks failed:\n  rank 0: KeyError: 'a bug'\nrank 0's traceback:\n...")
    assert user_error(bug_only) is None and user_error(KeyError("a bug")) is None
    exit_on_user_error(bug_only)  # returns: the caller re-raises it, traceback and all
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    exit_on_user_error(DatasetError("x"))  # returns too
