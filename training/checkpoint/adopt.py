"""A saved model for the commands that use one (evaluation, prediction): the checkpoint a
configuration names, and the configuration made to describe its model."""

from __future__ import annotations

from pathlib import Path

from training.checkpoint.files import CheckpointError, load_training_checkpoint
from training.config.schema import ModelConfig, RunConfig
from training.config.settings import from_settings


def checkpoint_path(cfg: RunConfig, key: str) -> Path:
    """The checkpoint named by ``<key>.checkpoint`` (``key``: ``evaluate`` or ``predict``; None:
    the run directory's latest), which must exist."""
    given = getattr(cfg, key).checkpoint
    path = Path(given) if given else Path(cfg.run_dir) / "checkpoints" / "latest.pt"
    if not path.exists():
        raise CheckpointError(f"{key}.checkpoint: no checkpoint at {path}; give {key}.checkpoint=/path/to/latest.pt")
    return path.resolve()


def adopt_checkpoint(resolved: RunConfig, key: str) -> None:
    """Make ``resolved`` describe the checkpoint's model (``<key>`` is ``evaluate`` or
    ``predict``): its model section and, when unset here, its variables and grid; record the path.
    Runs before the dataset is opened, so grid and variables are checked against the store."""
    path = checkpoint_path(resolved, key)
    _, saved = load_training_checkpoint(path)
    resolved.model = from_settings(ModelConfig, saved["model"])
    data, saved_data = resolved.data, saved.get("data") or {}
    for name in ("variables", "grid", "lead_time"):
        if getattr(data, name) is None:
            setattr(data, name, saved_data.get(name))
    getattr(resolved, key).checkpoint = str(path)
    source_store = path.parent.parent / "mlflow.db"
    if resolved.logging.tracking_uri is None and source_store.exists():
        resolved.logging.tracking_uri = f"sqlite:///{source_store}"  # beside the run it evaluates
