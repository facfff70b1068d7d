"""One run per run directory: a second run is refused with the holder's name; a killed run
leaves no stale lock; the app (local ranks and torchrun) reports the refusal in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import run_in_own_session
from tests.training.conftest import small_overrides
from training.launch.errors import EXIT_USER_ERROR
from training.launch.run_lock import RunDirBusyError, RunDirLock

ROOT = Path(__file__).resolve().parents[3]


def test_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    with RunDirLock(tmp_path / "run"):
        with pytest.raises(
            RunDirBusyError, match=rf"run_dir {tmp_path / 'run'} is in use by another run \(pid {os.getpid()} on "
        ):
            RunDirLock(tmp_path / "run").__enter__()
    with RunDirLock(tmp_path / "run"):  # released on exit
        pass


def test_a_killed_holder_leaves_nothing_stuck(tmp_path):
    code = (
        "import os, signal, sys\n"
        "from training.launch.run_lock import RunDirLock\n"
        f"RunDirLock({str(tmp_path)!r}).__enter__()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    assert done.returncode == -9
    assert "pid" in (tmp_path / ".run.lock").read_text()  # the dead holder's record is still there
    with RunDirLock(tmp_path):  # but not its lock
        pass


def _launch(args: list[str], cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return run_in_own_session([sys.executable, *args], cwd, {**env, "OMP_NUM_THREADS": "1"}, timeout_s=240)


@pytest.mark.parametrize("launcher", ["local", pytest.param("torchrun", marks=pytest.mark.slow)])
def test_a_second_run_on_a_busy_run_dir_is_refused_in_one_line(tmp_path, small_dataset, launcher):
    run_dir = tmp_path / "run"
    command = ["-m", "training", *small_overrides(run_dir, small_dataset), "trainer.steps=2"]
    if launcher == "torchrun":
        command = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *command]
    with RunDirLock(run_dir):  # what a live first run holds
        rc, out, err = _launch(command, tmp_path)
    refusals = [line for line in (out + err).splitlines() if "is in use by another run" in line]
    assert rc != 0 and len(refusals) == 1, err[-3000:]
    assert refusals[0].startswith(f"error: run_dir {run_dir} is in use by another run (pid {os.getpid()} on ")
    if launcher == "local":
        assert rc == EXIT_USER_ERROR
    assert not (run_dir / "checkpoints").exists()  # nothing of the refused run was written
