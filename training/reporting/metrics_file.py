"""The run directory's own record of every metric, written before MLflow sees anything (flushed),
so it survives a crash of rank 0 or of the tracking server:

- ``metrics.jsonl``: one JSON line per training step (``{"step": 12, "train/loss": ...}``). A
  resumed segment cuts it back to the steps before its checkpoint (:func:`keep_steps_before`),
  and :func:`read_history` reads it back as one history: training steps only.
- ``evaluations.jsonl``: one JSON line per evaluation (skill by lead time), ``step`` being the
  training step of the model it scored (its checkpoint's step), the lead in each metric's name
  (``{"step": 60, "eval/rmse/psi/model/024h": ...}``). A resumed segment keeps the evaluations of
  models up to its checkpoint (:func:`keep_evaluations_through`); :func:`read_evaluations` reads
  them back, one record per evaluation.

Evaluations have a file of their own so that nothing reading the training steps' axis (the
loss curve, a resume's replay, a script) ever meets them there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"  # training steps
EVALUATIONS = "evaluations.jsonl"  # evaluations, by the training step of the model scored


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
    return open(path, "a")  # noqa: SIM115 - closed in RunRecord.close()


class RunRecord:
    """Rank 0's record of the run in its directory, whatever ``logging.mlflow`` says: a line of
    ``metrics.jsonl`` per logged step and of ``evaluations.jsonl`` per evaluation, each flushed
    before :meth:`log_metrics` / :meth:`log_evaluation` return.

    A segment resumed at ``start_step`` (its checkpoint's step) first cuts both files back to
    what the earlier segments logged before it; :attr:`earlier` holds those records, steps then
    evaluations, as ``(step, metrics)``, for MLflow to catch up on.
    """

    def __init__(self, run_dir: Path, start_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.earlier: list[tuple[int, dict[str, Any]]] = []
        if start_step:
            self.earlier += keep_steps_before(self.run_dir / METRICS, start_step)
            self.earlier += keep_evaluations_through(self.run_dir / EVALUATIONS, start_step)
        self.metrics_path = self.run_dir / METRICS
        self._metrics = open_for_append(self.metrics_path)
        self._evaluations = None  # evaluations.jsonl, opened by the first evaluation

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._metrics.write(json.dumps({"step": step, **metrics}) + "\n")
        self._metrics.flush()

    def log_evaluation(self, step: int, metrics: dict[str, float]) -> None:
        if self._evaluations is None:
            self._evaluations = open_for_append(self.run_dir / EVALUATIONS)
        self._evaluations.write(json.dumps({"step": step, **metrics}) + "\n")
        self._evaluations.flush()

    def close(self) -> None:
        self._metrics.close()
        if self._evaluations is not None:
            self._evaluations.close()


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


def _keep(path: Path, keep: Callable[[int], bool]) -> list[tuple[int, dict[str, float]]]:
    """Cut the file at ``path`` back to the records whose step ``keep`` accepts, rewritten whole
    and renamed into place; return them. Lines that cannot be read (cut short by a crash) go."""
    if not path.exists():
        return []
    kept = [(line, step, record) for line, step, record in _records(path) if keep(step)]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line, _, _ in kept))
    os.replace(tmp, path)
    return [(step, record) for _, step, record in kept]


def keep_steps_before(path: Path, start: int) -> list[tuple[int, dict[str, float]]]:
    """Cut ``metrics.jsonl`` at ``path`` back to the records of steps before ``start`` (a resumed
    segment runs the others again); return them."""
    return _keep(path, lambda step: step < start)


def keep_evaluations_through(path: Path, start: int) -> list[tuple[int, dict[str, float]]]:
    """Cut ``evaluations.jsonl`` at ``path`` back to the evaluations of models at steps up to
    ``start`` (a segment resumed from the checkpoint of step ``start``: that model is the
    checkpoint itself; later ones are trained again); return them."""
    return _keep(path, lambda step: step <= start)


def read_history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """The metrics of every segment of the run in ``run_dir`` (its ``metrics.jsonl``, appended by
    each), by step, sorted: training steps only. A resumed segment re-runs the steps after its
    last checkpoint: a later record of a step replaces the earlier one's values key by key. Lines
    that cannot be read (cut short by a crash) are skipped, and so are ``eval/`` metrics, which
    runs before ``evaluations.jsonl`` existed wrote here with the lead hour as the step."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    by_step: dict[int, dict[str, float]] = {}
    for _, step, record in _records(path):
        training = {k: v for k, v in record.items() if not k.startswith("eval/")}
        if training:
            by_step.setdefault(step, {}).update(training)
    return sorted(by_step.items())


def read_evaluations(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """Every evaluation recorded in ``run_dir`` (its ``evaluations.jsonl``): ``(step of the model
    scored, metrics)``, one per evaluation, in the order they were made (so the last of a step
    is the latest). Lines that cannot be read (cut short by a crash) are skipped."""
    path = Path(run_dir) / EVALUATIONS
    if not path.exists():
        return []
    return [(step, record) for _, step, record in _records(path)]
