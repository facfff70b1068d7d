"""Checkpoints written atomically (temp file, fsync, rename) and read with ``weights_only``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from processor.errors import UserError

FORMAT_VERSION = 1
LATEST = "latest.pt"
BEST = "best.pt"  # the model of the lowest validation loss so far (trainer.keep_best)
PARTIAL_PREFIX = ".partial-"
TRAINING_KEYS = ("step", "model", "optimizer", "scheduler", "rng", "config")


class CheckpointError(UserError):
    """A checkpoint that cannot be used: unreadable, of another format, or another model."""


def save_checkpoint(
    directory: str | Path, state: dict[str, Any], progress: Callable[[int], None] | None = None, name: str = LATEST
) -> Path:
    """Write ``state`` to ``directory/name`` so that a reader sees the old file or the new
    one, never a partial one. ``progress`` is called with the bytes written so far after each
    write (a step hook's, :meth:`training.hooks.StepHook.checkpoint_write`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=PARTIAL_PREFIX, suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as f:
            _save(state, f, progress)
            f.flush()
            os.fsync(f.fileno())
        final = directory / name
        os.replace(tmp, final)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return final
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _WriteErrors:
    """A file for ``torch.save`` that keeps the first ``OSError`` of its writes: torch's zip
    writer turns a failed write (a full disk, a size limit) into a ``RuntimeError`` about file
    positions, and this gets the real cause back."""

    def __init__(self, f, progress: Callable[[int], None] | None = None) -> None:
        self.f, self.error, self.progress, self.written = f, None, progress, 0

    def write(self, data) -> int:
        try:
            n = self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        self.written += n
        if self.progress is not None:
            self.f.flush()  # what is reported written is in the file
            self.progress(self.written)
        return n

    def flush(self) -> None:
        self.f.flush()


def _save(state: dict[str, Any], f, progress: Callable[[int], None] | None = None) -> None:
    """``torch.save`` of ``state`` (with the format version) to ``f``; a failed write raises its ``OSError``."""
    writer = _WriteErrors(f, progress)
    try:
        torch.save({"format_version": FORMAT_VERSION, **state}, writer)
    except RuntimeError:
        if writer.error is not None:
            raise writer.error from None
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        found = state.get("format_version") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {path} has format {found!r}, expected {FORMAT_VERSION}")
    return state


def load_training_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A training checkpoint and the resolved configuration it was written with; a
    ``CheckpointError`` naming what is missing or unreadable otherwise."""
    state = load_checkpoint(path)
    missing = [k for k in TRAINING_KEYS if k not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing}: not a training checkpoint")
    try:
        config = yaml.safe_load(state["config"])
    except (yaml.YAMLError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} holds an unreadable configuration: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"checkpoint {path} holds no configuration mapping (found {type(config).__name__})")
    return state, config


def remove_partials(directory: str | Path) -> list[Path]:
    """Delete the temporary files of writes that were killed before their rename (only the
    checkpoint writer may call this, while it is not writing); return what was deleted."""
    removed = sorted(Path(directory).glob(f"{PARTIAL_PREFIX}*.pt"))
    for path in removed:
        path.unlink(missing_ok=True)
    return removed
