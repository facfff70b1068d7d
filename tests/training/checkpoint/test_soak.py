"""The soak: a long run under ``torchrun --max-restarts`` whose ranks are SIGKILLed again and again
(``debug.fault_every``: about every 20 steps, at a random time inside a step, after a
backward pass, or in the middle of writing a checkpoint) ends with the parameters of an
uninterrupted run, bit for bit; every checkpoint it wrote could be loaded the moment it
appeared; its MLflow run holds every step once.

About 14 minutes on a 2-core machine (12 of them the faulted run): marked ``soak``, left out of the default run
(``pyproject.toml``); ``pytest -m soak`` runs it, and so does CI (``.ci/run``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.agents import standalone
from tests.processes import run_in_own_session
from tests.training.conftest import small_config, small_overrides
from tests.training.hooks.faults import PLAN_DIR, POINTS, fault_overrides, fault_plan
from training.app import run
from training.checkpoint.files import PARTIAL_PREFIX, CheckpointError, load_checkpoint
from training.reporting.mlflow_store import local_store_uri

pytestmark = pytest.mark.soak

STEPS, EVERY, CHECKPOINT_EVERY, SEED = 1000, 20, 10, 7
SETTINGS = [
    f"trainer.steps={STEPS}",
    f"trainer.checkpoint_interval={CHECKPOINT_EVERY}",
    "trainer.val_interval=100",
    "trainer.heartbeat_s=0.2",
    "trainer.timeout_s=30",
    "evaluate.at_end_of_training=false",
]


class CheckpointWatcher(threading.Thread):
    """Loads ``latest.pt`` each time a new one appears (a rename gives it a new inode)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.steps, self.errors = path, [], []
        self._stop_event = threading.Event()

    def run(self) -> None:
        seen = None
        while not self._stop_event.wait(0.05):
            try:
                stat = self.path.stat()
            except FileNotFoundError:
                continue
            if (stat.st_ino, stat.st_mtime_ns) == seen:
                continue
            seen = (stat.st_ino, stat.st_mtime_ns)
            try:
                state = load_checkpoint(self.path)
                assert all(torch.isfinite(v).all() for v in state["model"].values())
                self.steps.append(state["step"])
            except (CheckpointError, AssertionError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _train_loss(run_dir: Path) -> dict[int, float]:
    record = json.loads((run_dir / "mlflow_run.json").read_text())
    client = MlflowClient(local_store_uri(run_dir))
    assert client.get_run(record["run_id"]).info.status == "FINISHED"
    assert len(client.search_runs([record["experiment_id"]])) == 1  # one MLflow run, every segment in it
    history = client.get_metric_history(record["run_id"], "train/loss")
    steps = [m.step for m in history]
    assert sorted(steps) == list(range(STEPS)), "a step lost or logged twice"
    return {m.step: m.value for m in history}


def test_a_run_killed_again_and_again_ends_as_an_uninterrupted_one(tmp_path, small_dataset):
    reference = tmp_path / "reference"
    run(small_config(reference, small_dataset, *SETTINGS))

    soak = tmp_path / "soak"
    watcher = CheckpointWatcher(soak / "checkpoints" / "latest.pt")
    watcher.start()
    command = [
        *standalone(2, "--max-restarts=1000"),
        "-m",
        "training",
        *small_overrides(soak, small_dataset),
        *SETTINGS,
        *fault_overrides(fault_every=EVERY, fault_seed=SEED),
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    started = time.monotonic()
    rc, stdout, stderr = run_in_own_session(command, tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"}, timeout_s=3600)
    minutes = (time.monotonic() - started) / 60
    watcher.stop()
    assert rc == 0, stderr[-5000:]

    plan = fault_plan(EVERY, SEED, STEPS, 2, CHECKPOINT_EVERY)
    fired = sorted(p.name for p in (soak / PLAN_DIR).iterdir())
    assert len(fired) >= len(plan) - 1  # an in-step timer of the last fault may outlive its run
    assert {name.rsplit("-", 1)[1] for name in fired} == set(POINTS)
    restarts = len(re.findall(r"resuming from step \d+", stdout + stderr))  # one per restart
    assert restarts >= len(fired) - 1

    for name, value in load_checkpoint(reference / "checkpoints" / "latest.pt")["model"].items():
        assert torch.equal(load_checkpoint(soak / "checkpoints" / "latest.pt")["model"][name], value), name
    assert not watcher.errors, watcher.errors[:3]
    assert len(set(watcher.steps)) >= STEPS // CHECKPOINT_EVERY // 2, watcher.steps
    assert not list((soak / "checkpoints").glob(f"{PARTIAL_PREFIX}*"))  # the killed writes' files were removed
    assert _train_loss(soak) == _train_loss(reference)  # every step once, the same values

    kinds = ", ".join(f"{k} {sum(n.endswith(k) for n in fired)}" for k in POINTS)
    summary = (
        f"soak: {minutes:.1f} min, {STEPS} steps, {len(fired)} faults ({kinds}), {restarts} restarts, "
        f"{len(watcher.steps)} checkpoints loaded as they appeared"
    )
    (tmp_path / "soak-summary.txt").write_text(summary + "\n")
    print(summary)
