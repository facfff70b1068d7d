"""A machine by name: a preset (:data:`processor.plan.machine.PRESETS`), a probe saved as JSON,
or ``probe``: measured now (:mod:`processor.plan.probe`)."""

from __future__ import annotations

import json
from pathlib import Path

from processor.plan.machine import PRESETS, Machine
from processor.plan.probe import probe


def load_machine(name: str, threads: int = 1, channels: int = 128, heads: int = 8) -> Machine:
    """A preset by name, a probe saved as JSON (a path), or ``probe``: measure now (ranks of
    ``threads`` threads, kernels shaped for ``channels`` and ``heads``)."""
    if name in PRESETS:
        return PRESETS[name]
    if name == "probe":
        return probe(threads, channels, heads)
    path = Path(name)
    if path.suffix == ".json" and path.exists():
        values = json.loads(path.read_text())
        values["window_attention_curve"] = tuple(tuple(p) for p in values.get("window_attention_curve", ()))
        return Machine(**values)
    raise ValueError(f"machine {name!r}: expected 'probe', a saved probe (.json) or one of {sorted(PRESETS)}")
