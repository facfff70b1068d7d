"""Checkpoints under faults: a write killed midway, and files that are corrupt or hostile.

The kill is real: a subprocess writes a large checkpoint with :func:`save_checkpoint` into the
run's checkpoint directory and is SIGKILLed while the file grows.
"""

from __future__ import annotations

import logging
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import (
    FORMAT_VERSION,
    LATEST,
    PARTIAL_PREFIX,
    CheckpointError,
    load_checkpoint,
    load_training_checkpoint,
)

ONE_RANK = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "logging.mlflow=false"]

# Loads the real checkpoint, pads it to 512 MiB and writes it back the way the trainer does.
WRITER = """
import sys, torch
from training.checkpoint.files import load_checkpoint, save_checkpoint
state = load_checkpoint(sys.argv[1] + "/latest.pt")
state["padding"] = torch.zeros(512 * 2**20, dtype=torch.uint8)
print("writing", flush=True)
save_checkpoint(sys.argv[1], state)
"""


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, small_dataset) -> pathlib.Path:
    """A one-rank run stopped (and checkpointed) at step 3 of 6."""
    run_dir = tmp_path_factory.mktemp("stopped")
    run(small_config(run_dir, small_dataset, *ONE_RANK, "trainer.stop_at_step=3"))
    return run_dir


def _kill_while_writing(ckpt_dir: pathlib.Path) -> pathlib.Path:
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ckpt_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            partials = list(ckpt_dir.glob(f"{PARTIAL_PREFIX}*.pt"))
            if partials and partials[0].stat().st_size > 32 * 2**20:
                writer.send_signal(signal.SIGKILL)
                break
            assert writer.poll() is None, "the writer finished before it could be killed"
            time.sleep(0.002)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
    return partials[0]


@pytest.mark.slow
def test_killed_while_writing_keeps_the_previous_checkpoint_and_resumes(stopped_run, small_dataset, caplog):
    ckpt_dir = stopped_run / "checkpoints"
    partial = _kill_while_writing(ckpt_dir)
    assert 32 * 2**20 < partial.stat().st_size < 512 * 2**20  # really cut off midway

    with pytest.raises(CheckpointError):
        load_checkpoint(partial)
    previous = load_checkpoint(ckpt_dir / LATEST)  # untouched: still the step-3 checkpoint
    assert previous["step"] == 3 and "padding" not in previous

    with caplog.at_level(logging.WARNING):
        resumed = run(small_config(stopped_run, small_dataset, *ONE_RANK))
    assert resumed["start_step"] == 3 and len(resumed["history"]) == 3
    assert load_checkpoint(ckpt_dir / LATEST)["step"] == 6
    assert not partial.exists()
    assert any("interrupted" in r.getMessage() for r in caplog.records)


class Payload:
    """Unpickling this runs code: it touches a file. weights_only loading must refuse it."""

    def __init__(self, target: pathlib.Path) -> None:
        self.target = target

    def __reduce__(self):
        return (pathlib.Path.touch, (self.target,))


def _write(path: pathlib.Path, kind: str, good: pathlib.Path) -> None:
    if kind == "code":
        torch.save({"format_version": FORMAT_VERSION, "model": Payload(path.parent / "pwned")}, path)
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "garbage":
        path.write_bytes(b"\x00not a checkpoint\xff" * 100)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "old_format":
        torch.save({**load_checkpoint(good), "format_version": FORMAT_VERSION - 1}, path)
    elif kind == "not_training":
        torch.save({"format_version": FORMAT_VERSION, "step": 3}, path)
    elif kind == "bad_config":
        torch.save({**load_checkpoint(good), "config": "model: [unclosed"}, path)


@pytest.mark.parametrize(
    "kind,message",
    [
        ("code", "cannot read checkpoint"),
        ("truncated", "cannot read checkpoint"),
        ("garbage", "cannot read checkpoint"),
        ("empty", "cannot read checkpoint"),
        ("tensor", "has format 'Tensor', expected 1"),
        ("old_format", "has format 0, expected 1"),
        ("not_training", r"lacks \['model', 'optimizer', 'scheduler', 'rng', 'config'\]"),
        ("bad_config", "unreadable configuration"),
    ],
)
def test_untrusted_checkpoint_is_a_clear_error(tmp_path, stopped_run, kind, message):
    path = tmp_path / "ckpt.pt"
    _write(path, kind, stopped_run / "checkpoints" / LATEST)
    with pytest.raises(CheckpointError, match=message):
        load_training_checkpoint(path)
    assert not (tmp_path / "pwned").exists()  # the payload never ran


def test_resuming_from_a_corrupt_checkpoint_fails_before_any_rank_starts(tmp_path, stopped_run, small_dataset):
    (tmp_path / "checkpoints").mkdir()
    _write(tmp_path / "checkpoints" / LATEST, "truncated", stopped_run / "checkpoints" / LATEST)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        run(small_config(tmp_path, small_dataset, "trainer.nprocs=2"))


def test_a_checkpoint_of_another_shape_is_a_clear_error(tmp_path, stopped_run, small_dataset):
    """Same configuration, but the saved tensors do not fit (e.g. edited by hand)."""
    state = load_checkpoint(stopped_run / "checkpoints" / LATEST)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(1)
    (tmp_path / "checkpoints").mkdir()
    torch.save(state, tmp_path / "checkpoints" / LATEST)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        run(small_config(tmp_path, small_dataset, *ONE_RANK))
