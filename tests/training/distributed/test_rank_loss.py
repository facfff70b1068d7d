"""A rank killed mid-step: every other rank names it and stops; torchrun restarts resume exactly.

The fault is real: the fault hook's ``fault_at_step`` makes rank 1 SIGKILL itself after its backward
pass, before the gradient all-reduce (once per run directory).
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from tests.agents import standalone
from tests.processes import run_in_own_session
from tests.training.conftest import small_config, small_overrides
from tests.training.hooks.faults import MARKER, fault_overrides
from training.app import run
from training.checkpoint.files import load_checkpoint

FAULT = [*fault_overrides(fault_at_step=4), "trainer.heartbeat_s=0.2", "trainer.timeout_s=30", "logging.mlflow=false"]


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: the slow tier
def test_survivors_name_the_lost_rank(tmp_path, small_dataset, ranks):
    cfg = small_config(tmp_path, small_dataset, f"trainer.nprocs={ranks}", *FAULT)
    with pytest.raises(RuntimeError) as info:
        run(cfg)
    report = str(info.value)
    lines = {int(m[1]): m[2] for m in re.finditer(r"^  rank (\d+): (.*)$", report, re.MULTILINE)}
    assert sorted(lines) == list(range(ranks)), report
    assert "killed by SIGKILL" in lines[1], report
    for r in set(range(ranks)) - {1}:
        assert "PeerFailureError: rank 1 was lost" in lines[r], report
    assert (tmp_path / MARKER).exists()
    assert load_checkpoint(tmp_path / "checkpoints" / "latest.pt")["step"] == 3  # the last one before the fault


@pytest.mark.slow
def test_torchrun_restart_resumes_bit_for_bit(tmp_path, small_dataset):
    straight = run(small_config(tmp_path / "straight", small_dataset, "logging.mlflow=false"))
    assert straight["start_step"] == 0

    faulty = tmp_path / "faulty"
    command = [
        *standalone(2, "--max-restarts=1"),
        "-m",
        "training",
        *small_overrides(faulty, small_dataset),
        *FAULT,
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rc, _, stderr = run_in_own_session(command, tmp_path, env, timeout_s=300)
    assert rc == 0, stderr[-5000:]
    assert (faulty / MARKER).exists()  # the fault did happen, on the first attempt
    assert re.search(r"exitcode: -9\) local_rank: 1", stderr), stderr[-3000:]  # torchrun saw it die

    resumed = load_checkpoint(faulty / "checkpoints" / "latest.pt")
    reference = load_checkpoint(tmp_path / "straight" / "checkpoints" / "latest.pt")
    assert resumed["step"] == reference["step"] == 6
    for name, value in reference["model"].items():
        assert torch.equal(resumed["model"][name], value), name
