"""Storage that fails at checkpoint time (here a file-size limit, as a full disk would): a clear
one-line error, the previous checkpoint intact and loadable, every rank stopped in time."""

from __future__ import annotations

import os
import sys
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
