"""A resumed run continues as it was started: the run directory's saved settings are the base,
and only what this command line sets explicitly changes them.

``python -m training trainer.steps=60 trainer.stop_at_step=30 hydra.run.dir=R`` and then
``python -m training hydra.run.dir=R`` trains to step 60, not to the default's 1000: the second
command sets nothing but the run directory, so every setting is the first run's. A setting
given again (``trainer.lr=1e-3``) replaces the saved one and is named at start
(``resuming R at step 30 of 60 (changed: trainer.lr 0.003 -> 0.001)``); a config group chosen
again (``strategy=shard_heads``) replaces that whole section. What changes the model is still
refused by the checkpoint's own check (:func:`training.checkpoint.resume.check_compatible`).

The saved settings are the checkpoint's (the resolved configuration it was written with) or,
for a run that stopped before its first checkpoint, ``config.yaml`` in the run directory.
Settings of one invocation (:data:`INVOCATION_KEYS`) are never taken from the saved ones: a
run stopped at step 30 by ``trainer.stop_at_step=30`` would otherwise stop there again, and a run
trained on GPUs could not continue on a machine without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode

from training.checkpoint.files import LATEST, load_training_checkpoint
from training.config.saved_names import current_names
from training.config.schema import RunConfig, schema_keys
from training.config.settings import (
    SAVED_CONFIG,
    flatten,
    from_settings,
    sets_key,
    settings_not_given,
    to_settings,
)

# Settings of one invocation, not of the run: this command line's (or the default) always. The
# device is the machine's: a run trained on GPUs continues on CPUs under the default ``auto``.
INVOCATION_KEYS = (
    "run_dir",
    "trainer.stop_at_step",
    "trainer.resume",
    "evaluate.at_stop",
    "trainer.device",
    "debug.share_gpu",
)


@dataclass(frozen=True)
class SavedRun:
    """What a run directory holds of an earlier run: its settings and the step of its checkpoint
    (None: it stopped before its first checkpoint)."""

    settings: dict[str, Any]
    step: int | None
    source: Path


def saved_run(run_dir: Path) -> SavedRun | None:
    """The run directory's earlier run, from its checkpoint or its ``config.yaml``; None if it has
    neither (a new run). An unreadable checkpoint raises its ``CheckpointError`` here."""
    checkpoint = run_dir / "checkpoints" / LATEST
    if checkpoint.exists():
        state, settings = load_training_checkpoint(checkpoint)
        return SavedRun(current_names(settings), int(state["step"]), checkpoint)
    config = run_dir / SAVED_CONFIG
    if config.exists():
        try:
            settings = yaml.safe_load(config.read_text())
        except yaml.YAMLError:
            return None
        return SavedRun(current_names(settings), None, config) if isinstance(settings, dict) else None
    return None


def given_keys(overrides: list[str]) -> list[str]:
    """The keys (or config groups) that command-line ``overrides`` set, in Hydra's syntax:
    ``trainer.lr=1e-3`` -> ``trainer.lr``, ``+trainer.x=1`` -> ``trainer.x``, ``strategy=none``
    -> ``strategy``."""
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)]


def command_line_keys(multirun_members: bool = False) -> list[str] | None:
    """The keys this command line set (:func:`given_keys` of Hydra's overrides); None outside
    Hydra (the API) and, unless ``multirun_members``, in a ``--multirun`` member: a training
    sweep's members do not resume from saved settings, an evaluation sweep's still take the
    checkpoint's."""
    if not HydraConfig.initialized() or (HydraConfig.get().mode != RunMode.RUN and not multirun_members):
        return None
    return given_keys(list(HydraConfig.get().overrides.task))


def _taken(key: str, given: list[str]) -> bool:
    """Whether ``key`` is this invocation's: set on its command line (itself or its section) or
    one of :data:`INVOCATION_KEYS`."""
    return sets_key(key, (*given, *INVOCATION_KEYS))


def continue_from(cfg: RunConfig, saved: SavedRun, given: list[str]) -> RunConfig:
    """``cfg`` (this command line's configuration) with every setting it does not give explicitly
    taken from ``saved``: the run as it was started, changed only where asked."""
    kept = settings_not_given(saved.settings, given, INVOCATION_KEYS, schema_keys())
    return from_settings(RunConfig, kept, base=cfg)


def changed_settings(saved: dict[str, Any], resolved: RunConfig) -> list[str]:
    """``key old -> new`` for each setting of ``resolved`` that differs from ``saved`` (the
    invocation's own keys aside)."""
    before, after = flatten(saved), flatten(to_settings(resolved))
    return [
        f"{key} {before.get(key, 'unset')} -> {value}"
        for key, value in sorted(after.items())
        if before.get(key) != value and not _taken(key, [])
    ]


def resume_line(run_dir: Path, saved: SavedRun, resolved: RunConfig) -> str:
    """What a resumed run says at start: from which step, to which, and what changed."""
    changes = changed_settings(saved.settings, resolved)
    steps = resolved.trainer.steps
    where = (
        f"at step {saved.step} of {steps}"
        if saved.step is not None
        else f"from step 0 of {steps} (it has settings, {saved.source.name}, but no checkpoint)"
    )
    return f"resuming {run_dir} {where}" + (f" (changed: {'; '.join(changes)})" if changes else "")
