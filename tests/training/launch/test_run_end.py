"""A run keeps its word on the command line: a resume continues the run as it was started, a stop
says how to continue, Ctrl-C and SIGTERM stop cleanly, and bad input is one line that creates
nothing. The app runs for real, in subprocesses of their own sessions, on the small dataset."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.processes import run_in_own_session
from tests.training.conftest import small_config, small_overrides
from training.checkpoint.files import load_checkpoint
from training.launch.errors import DEBUG_HINT, EXIT_USER_ERROR
from training.launch.launcher import prepare
from training.launch.run_end import step_summary
from training.launch.run_settings import SavedRun, changed_settings, continue_from, given_keys
from training.skill.scores import lead_labels

ONE_RANK = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"]


def _tiny(dataset: Path) -> list[str]:
    """The small overrides, the run directory left to the command line."""
    return [o for o in small_overrides(Path("."), dataset) if not o.startswith("run_dir=")]


def _env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**environ, "OMP_NUM_THREADS": "1"}


def _training(args: list[str], cwd: Path) -> tuple[int, str]:
    rc, out, err = run_in_own_session([sys.executable, "-m", "training", *args], cwd, _env(), timeout_s=300)
    return rc, out + err


def _step_of(run_dir: Path) -> int:
    return int(load_checkpoint(run_dir / "checkpoints" / "latest.pt")["step"])


def _mlflow_matches_skill_csv(run_dir: Path) -> None:
    """MLflow's latest value of every model RMSE of the run equals ``skill.csv`` (1e-9), logged
    at the final training step, never at a lead hour."""
    record = json.loads((run_dir / "mlflow_run.json").read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    latest = client.get_run(record["run_id"]).data.metrics
    labels = lead_labels(sorted({float(r["lead_h"]) for r in _csv_rows(run_dir)}))
    rows = [r for r in _csv_rows(run_dir) if r["kind"] == "model"]
    assert rows
    for r in rows:
        name = f"eval/rmse/{r['variable']}/model/{labels[float(r['lead_h'])]}"
        assert latest[name] == pytest.approx(float(r["rmse"]), rel=1e-9, abs=0), name
        assert [m.step for m in client.get_metric_history(record["run_id"], name)] == [6]


def _csv_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "skill.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_stop_resume_stop_resume_keeps_the_run_s_settings_and_mlflow_tells_the_truth(tmp_path, small_dataset):
    run_dir = tmp_path / "R"
    first = [*_tiny(small_dataset), "trainer.steps=6", "trainer.stop_at_step=2", f"hydra.run.dir={run_dir}"]
    rc, text = _training(first, tmp_path)
    assert rc == 0, text[-3000:]
    assert f"stopped at step 2 of 6; continue with: {sys.executable} -m training hydra.run.dir={run_dir}" in text
    assert _step_of(run_dir) == 2 and not (run_dir / "skill.md").exists()  # a stop skips the final evaluation
    second = [f"hydra.run.dir={run_dir}", "trainer.lr=0.001", "trainer.stop_at_step=4"]  # nothing else given
    rc, text = _training(second, tmp_path)
    assert rc == 0, text[-3000:]
    assert f"resuming {run_dir} at step 2 of 6 (changed: trainer.lr 0.003 -> 0.001)" in text
    assert "stopped at step 4 of 6" in text and _step_of(run_dir) == 4
    rc, text = _training([f"hydra.run.dir={run_dir}"], tmp_path)
    assert rc == 0, text[-3000:]
    assert f"resuming {run_dir} at step 4 of 6" in text and "finished: train loss" in text
    assert re.search(r"finished: train loss [\d.]+, [\d.]+ samples/s \(median step [\d.]+ ms\), MLflow run", text)
    saved = yaml.safe_load(load_checkpoint(run_dir / "checkpoints" / "latest.pt")["config"])
    assert _step_of(run_dir) == 6 and saved["model"]["num_channels"] == 32  # the run's own model, not the default
    assert saved["trainer"]["lr"] == 0.001  # the change stays with the run
    _mlflow_matches_skill_csv(run_dir)
    rc, text = _training([f"hydra.run.dir={run_dir}"], tmp_path)
    assert rc == 0 and f"{run_dir} finished at step 6 of 6: nothing to train" in text, text[-3000:]
    assert "train loss nan" not in text and "MLflow run None" not in text


def test_a_run_directory_with_settings_and_no_checkpoint_starts_from_step_0(tmp_path, small_dataset, caplog):
    prepare(small_config(tmp_path / "source", small_dataset, *ONE_RANK, "trainer.steps=2"))  # writes config.yaml
    run_dir = tmp_path / "R"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text((tmp_path / "source" / "config.yaml").read_text())
    with caplog.at_level(logging.INFO, logger="training.launch.launcher"):
        resolved = prepare(small_config(run_dir, small_dataset), given=["run_dir"])  # the default's 600 steps
    assert resolved.trainer.steps == 2 and resolved.trainer.nprocs == 1  # the run's own
    line = f"resuming {run_dir} from step 0 of 2 (it has settings, config.yaml, but no checkpoint)"
    assert line in caplog.text


def _start(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        command = [sys.executable, "-m", "training", *args]
        return subprocess.Popen(command, cwd=cwd, env=_env(), start_new_session=True, stdout=out, stderr=out)


def _wait_for_steps(run_dir: Path, steps: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not reach step {steps} (exit {proc.poll()})")


def _session_processes(sid: int, wait_s: float = 15.0) -> list[str]:
    """The processes left in session ``sid`` once ``wait_s`` has passed or none are (helpers
    such as multiprocessing's resource tracker end a moment after the launcher)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(sid)], capture_output=True, text=True).stdout
        left = [line for line in out.splitlines() if line.strip()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, whom, code", [(signal.SIGINT, "group", 130), (signal.SIGTERM, "launcher", 143)], ids=["ctrl-c", "sigterm"]
)
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_stops_every_rank(tmp_path, small_dataset, sig, whom, code):
    run_dir = tmp_path / "R"
    log = tmp_path / "log.txt"
    proc = _start([*_tiny(small_dataset), "trainer.steps=500", f"hydra.run.dir={run_dir}"], tmp_path, log)
    try:
        _wait_for_steps(run_dir, 3, proc)
        if whom == "group":  # a terminal's Ctrl-C reaches every process of the foreground group
            os.killpg(proc.pid, sig)
        else:  # a scheduler's SIGTERM to the job's process
            os.kill(proc.pid, sig)
        assert proc.wait(timeout=120) == code, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    name = signal.Signals(sig).name
    found = re.search(
        rf"interrupted by {name}: stopped after step (\d+) of 500, checkpoint written; continue with: ", text
    )
    assert found, text[-3000:]
    assert _step_of(run_dir) == int(found[1]) and "Traceback" not in text
    assert _session_processes(proc.pid) == []  # no rank left behind
    assert not (run_dir / ".stop-request").exists()


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once(tmp_path, small_dataset):
    run_dir = tmp_path / "R"
    log = tmp_path / "log.txt"
    proc = _start([*_tiny(small_dataset), "trainer.steps=500", f"hydra.run.dir={run_dir}"], tmp_path, log)
    try:
        _wait_for_steps(run_dir, 3, proc)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "interrupted again: stopping every rank at once" in text and "Traceback" not in text, text[-3000:]
    assert _session_processes(proc.pid) == []


@pytest.mark.parametrize(
    "override, line",
    [
        pytest.param(  # the default tier has this error's '+' form in test_run_lifecycle.py
            "trainer.stepz=3",
            "error: config key trainer.stepz is not a setting of the schema: did you mean trainer.steps?",
            marks=pytest.mark.slow,
        ),
        (
            "strategy=shard_sequnce",
            "error: config group strategy has no option shard_sequnce: did you mean shard_sequence? "
            "(options: auto, none, shard_channels, shard_heads, shard_hybrid, shard_sequence)",
        ),
        pytest.param(  # refused in-process in the default tier (test_app.py's test_bad_input_fails_before_training)
            "data.path=/typo/era5.zarr",
            "error: data.path = /typo/era5.zarr does not exist: give an existing anemoi-datasets store (the built-in "
            "datasets are written only at a path named rossby_haurwitz*.zarr or regional_t2m*.zarr, as the default "
            "data/rossby_haurwitz_o32.zarr)",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "hydra.run.dir=a_file/run", "error: hydra.run.dir = a_file/run cannot be created: ", marks=pytest.mark.slow
        ),
        pytest.param(  # the check itself is in the default tier (test_cli_check.py)
            "logging.plots=maybe",
            "error: config key logging.plots cannot be 'maybe': Value 'maybe' is not a valid bool (type str)",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, override, line):
    (tmp_path / "a_file").write_text("not a directory")
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, text = _training([override], tmp_path)
    lines = [x for x in text.splitlines() if x.strip()]
    assert rc == EXIT_USER_ERROR and len(lines) == 2 and lines[1] == f"({DEBUG_HINT})", text[-3000:]
    assert lines[0].startswith(line), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no outputs/, no data/


def test_the_saved_settings_are_the_base_and_the_given_keys_change_them():
    saved = {
        "trainer": {"lr": 0.003, "steps": 60, "stop_at_step": 30, "device": "cuda"},
        "strategy": {"name": "shard_heads", "ring": None},
    }
    from training.config.schema import run_config

    cfg = run_config(small_config(Path("/tmp/x"), Path("/tmp/data.zarr"), "trainer.lr=0.001", "trainer.steps=600"))
    given = given_keys(["trainer.lr=0.001", "strategy=shard_sequence"])
    assert given == ["trainer.lr", "strategy"]
    merged = continue_from(cfg, SavedRun(saved, 30, Path("x")), given)
    assert merged.trainer.lr == 0.001 and merged.trainer.steps == 60  # given, then saved
    assert merged.trainer.stop_at_step is None  # one invocation's setting, never carried over
    assert merged.trainer.device == "auto"  # the machine's: a GPU run continues on CPUs
    assert merged.strategy.name == "shard_sequence"  # a group given again is this command line's
    changes = changed_settings(saved, merged)
    assert "trainer.lr 0.003 -> 0.001" in changes and "strategy.name shard_heads -> shard_sequence" in changes
    assert not any(c.startswith(("trainer.steps ", "trainer.stop_at_step ")) for c in changes)


def test_the_summary_line_gives_the_median_speed_and_the_profiled_share():
    history = [(s, {"step_time_s": t, "samples_per_s": 2 / t}) for s, t in enumerate([0.5, 0.1, 0.2, 0.3])]
    assert step_summary(history) == "8.33 samples/s (median step 250.0 ms)"
    history[2][1]["model_compute_share"] = 0.414
    assert step_summary(history).endswith(", 41% of a step in the model's matmuls, attention and message passing")
