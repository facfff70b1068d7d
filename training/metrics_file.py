"""``metrics.jsonl``: the run directory's own record of every metric, one JSON line per step.

The training loop appends to it (flushed) before MLflow sees anything, so it survives a crash
of rank 0 or of the tracking server; a resumed segment cuts it back to the steps before its
checkpoint (:func:`keep_steps_before`), and :func:`read_history` reads it back as one history.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def open_for_append(path: Path):
    """``metrics.jsonl`` opened for appending. A last line cut short (a crash mid-write) is
    ended first, so that this segment's first record starts a line of its own."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        if cut:
            with open(path, "a") as f:
                f.write("\n")
    return open(path, "a")  # noqa: SIM115 - closed in Tracker.finish()


def _records(path: Path) -> list[tuple[str, int, dict[str, float]]]:
    """Each readable line of ``path`` with its step and metrics; lines cut short by a crash are skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            step = int(record.pop("step"))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        records.append((line, step, record))
    return records


def keep_steps_before(path: Path, start: int) -> list[tuple[int, dict[str, float]]]:
    """Cut ``metrics.jsonl`` at ``path`` back to the records of steps before ``start`` (a resumed
    segment runs the others again), rewritten whole and renamed into place; return them. Lines
    that cannot be read (cut short by a crash) go."""
    if not path.exists():
        return []
    kept = [(line, step, record) for line, step, record in _records(path) if step < start]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line, _, _ in kept))
    os.replace(tmp, path)
    return [(step, record) for _, step, record in kept]


def read_history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """The metrics of every segment of the run in ``run_dir`` (its ``metrics.jsonl``, appended by
    each), by step, sorted. A resumed segment re-runs the steps after its last checkpoint: a
    later record of a step replaces the earlier one's values key by key. Lines that cannot be
    read (cut short by a crash) are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict[str, float]] = {}
    for _, step, record in _records(path):
        by_step.setdefault(step, {}).update(record)
    return sorted(by_step.items())
