"""Storage that fails under a running job: at checkpoint time (here a file-size limit, as a full
disk would) a clear one-line error, the previous checkpoint intact and loadable, every rank
stopped in time; a dataset damaged mid-run, one line naming the date and variables."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import run_in_own_session
from tests.training.conftest import small_overrides
from training.app import EXIT_USER_ERROR
from training.checkpoint import LATEST, PARTIAL_PREFIX, load_checkpoint


def _train(run_dir: Path, dataset: Path, steps: int, file_size_limit: int | None = None) -> tuple[int, str, str]:
    """``python -m training`` on 2 local ranks; with ``file_size_limit``, every file it (and its
    ranks, which inherit the limit) writes is capped at that many bytes (writes past it fail
    with EFBIG: Python ignores SIGXFSZ)."""
    command = [sys.executable, "-m", "training", *small_overrides(run_dir, dataset)]
    command += [f"trainer.steps={steps}", "logging.mlflow=false", "evaluate.at_end_of_training=false"]
    if file_size_limit is not None:
        limit = (
            "import os, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({file_size_limit}, {file_size_limit})); "
            "os.execv(sys.executable, sys.argv[1:])"
        )
        command = [sys.executable, "-c", limit, *command]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return run_in_own_session(command, run_dir.parent, {**env, "OMP_NUM_THREADS": "1"}, timeout_s=240)


def test_a_checkpoint_that_cannot_be_written_stops_every_rank_and_keeps_the_last_one(tmp_path, small_dataset):
    run_dir = tmp_path / "run"
    rc, _, err = _train(run_dir, small_dataset, steps=3)  # a checkpoint at step 3
    assert rc == 0, err[-3000:]
    latest = run_dir / "checkpoints" / LATEST
    size = latest.stat().st_size

    rc, out, err = _train(run_dir, small_dataset, steps=6, file_size_limit=size // 2)  # resumes; step 6 fails
    errors = [line for line in (out + err).splitlines() if line.startswith("error: ")]
    assert rc == EXIT_USER_ERROR, err[-3000:]
    assert errors == [
        f"error: could not write the checkpoint of step 6 to {run_dir / 'checkpoints'}: File too large; "
        "the previous checkpoint there is intact: free space or point run_dir elsewhere (copying the "
        "checkpoints), then run again to resume"
    ], err[-3000:]
    assert "Traceback" not in err
    assert load_checkpoint(latest)["step"] == 3  # intact and loadable
    assert not list(latest.parent.glob(f"{PARTIAL_PREFIX}*"))  # the failed write left nothing

    rc, _, err = _train(run_dir, small_dataset, steps=6)  # space again: the run resumes and ends
    assert rc == 0, err[-3000:]
    assert load_checkpoint(latest)["step"] == 6


def test_a_store_damaged_mid_run_stops_every_rank_naming_date_and_variables(tmp_path, small_dataset):
    """The store passes the up-front scan; then, while training reads it, every date's chunk
    turns unreadable: one line naming the date and variables, and every rank ends."""
    store = Path(shutil.copytree(small_dataset, tmp_path / "store.zarr"))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "training", *small_overrides(run_dir, store), "trainer.steps=2000"]
    command += ["evaluate.at_end_of_training=false", "trainer.checkpoint_interval=1000"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, start_new_session=True, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):  # training has begun
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        for chunk in (store / "data").glob("*.0.0.0"):
            chunk.write_bytes(b"not a blosc chunk" * 10)
        out, err = proc.communicate(timeout=180)  # the collective timeout is 120 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    errors = [line for line in (out + err).splitlines() if line.startswith("error: ")]
    assert proc.returncode == EXIT_USER_ERROR, err[-3000:]
    assert len(errors) == 1 and re.fullmatch(
        r"error: cannot read date \d{4}-\d\d-\d\dT\d\d:00:00 \(index \d+\), variables psi, .*, of "
        rf"{re.escape(str(store))}: .*",
        errors[0],
    ), errors
