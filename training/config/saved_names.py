"""Saved settings (a checkpoint's, a run directory's ``config.yaml``) read under today's names:
a key renamed since a run was saved is read under its new name, and a setting added since then
whose default is not what that run ran is read at the value it ran with."""

from __future__ import annotations

import copy
from typing import Any

# Keys renamed since runs were saved: old key -> its key now. Saved settings are read under the
# new names, so a run directory or a checkpoint written before a rename still resumes as it was.
MOVED_KEYS = {"trainer.debug_share_gpu": "debug.share_gpu"}
# Settings added since runs were saved whose default is not what those runs ran: a saved run
# without the key ran this value (its checkpoint holds that model), and resumes with it.
EARLIER_VALUES = {
    "model.mapper": "mean_mlp",
    "model.trainable_size": 0,
    "model.valid_time_forcing": False,
    "model.multistep_input": 1,
    "model.baseline": "persistence",
    "model.field_input": False,  # runs before the whole-field forecast was given
    "data.calibration_fraction": 0.0,  # runs before a calibration period was held out: they trained on it
    "trainer.batch_size": 1,
    "trainer.keep_best": False,  # runs before best.pt scored their last model
    "trainer.matmul": "aten",  # runs before processor/matmul ran torch's GEMM: they resume on it
    # inside a section a resume compares whole (trainer.rollout): filled so it compares equal
    "trainer.rollout.step_decay": 1.0,
}


def current_names(settings: dict[str, Any]) -> dict[str, Any]:
    """Saved ``settings`` with every key of :data:`MOVED_KEYS` under its new name and those of
    :data:`EARLIER_VALUES` it lacks at the value the run ran with (a copy)."""
    moved = copy.deepcopy(settings)
    for old, new in MOVED_KEYS.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        section = moved.get(old_section)
        if isinstance(section, dict) and old_key in section:
            moved.setdefault(new_section, {}).setdefault(new_key, section.pop(old_key))
    for key, value in EARLIER_VALUES.items():
        *path, name = key.split(".")
        section: Any = moved
        for part in path:  # only into sections the saved run has
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict):
            section.setdefault(name, value)
    return moved
