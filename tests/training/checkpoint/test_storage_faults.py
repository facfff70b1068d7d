"""Storage that fails under a running job: at checkpoint time (a file-size limit; a real full
tmpfs; a file system remounted read-only) a clear one-line error, the previous checkpoint
intact and loadable, every rank stopped in time; a dataset damaged mid-run, one line naming
the date and variables."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import run_in_own_session
from tests.training.conftest import small_overrides
from training.checkpoint.files import LATEST, PARTIAL_PREFIX, load_checkpoint
from training.launch.errors import EXIT_USER_ERROR

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`


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
    command += ["data.preload=false"]  # else the whole store is in memory before the damage
    # No validation before the damage: its baselines' fit reads (and caches) nearly every date, and
    # the damage landing after it went unread through 2,000 steps. Each training step reads new
    # dates for its first epoch (hundreds of steps), so the damage is read whenever it lands there.
    command += ["trainer.val_interval=1000"]
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
        chunks = list((store / "data").glob("*.0.0.0"))
        assert chunks, f"no chunk of {store / 'data'} to damage: the store's layout changed"
        for chunk in chunks:
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


def _can_mount() -> bool:
    """Whether this machine lets an unprivileged mount namespace mount a tmpfs."""
    probe = ["unshare", "--mount", "--map-root-user", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# Inside a mount namespace of its own: train to step 3 on the real disk, put the checkpoint
# directory on a tmpfs with room for 1.5 checkpoints (full) or remount it read-only, and
# resume to step 6, whose checkpoint cannot be written; then copy out what the tmpfs holds.
_VOLUME_SCRIPT = """
set -e
"$@" trainer.steps=3
size=$(stat -c %s "$CK/latest.pt")
mkdir -p "$RUN/saved" "$RUN/after"
cp "$CK/latest.pt" "$RUN/saved/"
mount -t tmpfs -o size=$((size * 3 / 2)) tmpfs "$CK"
cp "$RUN/saved/latest.pt" "$CK/"
if [ "$KIND" = read_only ]; then mount -o remount,ro "$CK"; fi
set +e
"$@" trainer.steps=6 > "$RUN/after/stdout" 2> "$RUN/after/stderr"
echo $? > "$RUN/after/rc"
ls -a "$CK" > "$RUN/after/listing"
cp "$CK/latest.pt" "$RUN/after/"
"""


@pytest.mark.skipif(not _can_mount(), reason="no unprivileged mount namespace (unshare --mount --map-root-user)")
@pytest.mark.parametrize("kind,reason", [("full", "No space left on device"), ("read_only", "Read-only file system")])
def test_a_full_or_read_only_checkpoint_volume_stops_every_rank(tmp_path, small_dataset, kind, reason):
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "training", *small_overrides(run_dir, small_dataset)]
    train += ["logging.mlflow=false", "evaluate.at_end_of_training=false"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    env.update(OMP_NUM_THREADS="1", RUN=str(run_dir), CK=str(run_dir / "checkpoints"), KIND=kind)
    command = ["unshare", "--mount", "--map-root-user", "bash", "-c", _VOLUME_SCRIPT, "volume", *train]
    rc, out, err = run_in_own_session(command, tmp_path, env, timeout_s=300)
    assert rc == 0, err[-3000:]

    after = run_dir / "after"
    err = (after / "stderr").read_text()
    errors = [line for line in ((after / "stdout").read_text() + err).splitlines() if line.startswith("error: ")]
    assert int((after / "rc").read_text()) == EXIT_USER_ERROR, err[-3000:]
    assert errors == [
        f"error: could not write the checkpoint of step 6 to {run_dir / 'checkpoints'}: {reason}; "
        "the previous checkpoint there is intact: free space or point run_dir elsewhere (copying the "
        "checkpoints), then run again to resume"
    ], err[-3000:]
    assert "Traceback" not in err
    assert load_checkpoint(after / LATEST)["step"] == 3  # intact and loadable
    assert not [n for n in (after / "listing").read_text().split() if n.startswith(PARTIAL_PREFIX)]
