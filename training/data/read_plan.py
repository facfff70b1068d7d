"""What a store that allows NaN is read as, found once a run and shared by its ranks.

Finding it means reading the whole store (:func:`~training.data.gappy_points.scan_points`). The
launcher does that once, before any rank starts, and writes the plan into the run directory
(:data:`PLAN_FILE`); every rank, spawned locally, under torchrun or in the launcher's own
process, reads the plan instead of the store. A plan is used only

- for the store, its attributes and the variables it was made for (:func:`plan_key`), and
- by the launch that wrote it: it records the run directory's lock (``.run.lock``, which the
  launcher rewrites at every start, :mod:`training.launch.run_lock`: its line and the time it
  was written), and a rank takes it only while the lock is the same.

Otherwise, or where the file is missing, damaged or out of range, the rank scans the store
itself, as before.

The scan also notes whether the store holds an inf (``build.allow_nans`` allows NaN only). Where
it holds none, every value the run reads is finite by the plan's making, so the launcher's
``check_finite`` need not read the store a second time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.data.gappy_points import MAX_GAP_DATES, MAX_MASKED_POINTS

log = logging.getLogger(__name__)

PLAN_FILE = "store_read_plan.npz"  # in the run directory
LOCK_FILE = ".run.lock"  # training.launch.run_lock.LOCK_NAME (a test keeps the two equal)
FORMAT = 1


@dataclass(frozen=True)
class ReadPlan:
    """A store read around its NaN: its ``variables`` read (any field over part of the grid left
    out), ``kept`` ``(points,)`` (ascending store indices of the points in the grid), ``missing``
    (the dates the kept points' gaps add to the store's missing dates), and ``finite`` (no inf
    anywhere in the store's variables read)."""

    variables: tuple[str, ...]
    kept: np.ndarray
    missing: frozenset[int]
    finite: bool


def plan_key(where: str, shape: tuple[int, ...], attributes: Any, chosen: tuple) -> str:
    """What a plan was made for: the store (its path or ``open_dataset`` spec, its shape, a digest
    of its attributes, which anemoi-datasets rewrites on every build), the run's ``chosen``
    ``data.variables``, ``data.forcing`` and ``data.diagnostic``, and the rules' thresholds."""
    digest = hashlib.sha256(json.dumps(attributes, sort_keys=True, default=str).encode()).hexdigest()
    names = dict(zip(("variables", "forcing", "diagnostic"), (list(c or []) for c in chosen)))
    rules = {"format": FORMAT, "max_gap_dates": MAX_GAP_DATES, "max_masked_points": MAX_MASKED_POINTS}
    return json.dumps({"store": where, "shape": list(shape), "attributes": digest, **names, **rules})


def save_plan(plan: ReadPlan, key: str, run_dir: str | Path, n_stored: int) -> Path | None:
    """Write ``plan`` for ``key`` and this launch into ``run_dir``, atomically (a rank never reads
    half a file); ``n_stored``: the store's points. A failed write costs the ranks a scan, not the
    run: a warning, and None."""
    path = Path(run_dir) / PLAN_FILE
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    kept = np.zeros(n_stored, dtype=bool)
    kept[plan.kept] = True
    try:
        with open(partial, "wb") as f:
            np.savez(
                f,
                key=np.array(key),
                launch=np.array(_launch_line(run_dir)),
                variables=np.array(plan.variables, dtype=str),
                kept=np.packbits(kept),
                missing=np.array(sorted(plan.missing), dtype=np.int64),
                finite=np.array(plan.finite),
            )
        partial.replace(path)
        return path
    except OSError as exc:
        log.warning("cannot write %s (%s): each rank will scan the store itself", path, exc)
        return None
    finally:
        partial.unlink(missing_ok=True)


def load_plan(key: str, run_dir: str | Path | None, names: list[str], n_stored: int) -> ReadPlan | None:
    """The plan this launch left in ``run_dir`` for ``key``, on a store of variables ``names`` and
    ``n_stored`` points; None where there is none, or it is another launch's, another store's or
    other variables', or cannot be read."""
    path = Path(run_dir) / PLAN_FILE if run_dir is not None else None
    launch = _launch_line(run_dir) if path is not None and path.exists() else ""
    if not launch:  # no plan, or no launcher's lock
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["key"]) != key or str(saved["launch"]) != launch:
                log.warning("%s was written for another store, variables or launch: scanning the store", path)
                return None
            packed, variables = saved["kept"], tuple(str(v) for v in saved["variables"])
            if len(packed) != -(-n_stored // 8) or not set(variables) <= set(names):
                log.warning("%s does not fit the store: scanning the store", path)
                return None
            kept = np.flatnonzero(np.unpackbits(packed, count=n_stored)).astype(np.int64)
            plan = ReadPlan(variables, kept, frozenset(int(t) for t in saved["missing"]), bool(saved["finite"]))
    except Exception as exc:  # a damaged file is no worse than none: the store is scanned
        log.warning("cannot read %s (%s): scanning the store", path, exc)
        return None
    log.debug("reading the store by %s", path)
    return plan


def _launch_line(run_dir: str | Path) -> str:
    """This launch, as the run directory's lock says it: the line the launcher wrote there at its
    start and the time it wrote it (ns: two launches of one process within a second differ); ""
    where there is no lock (no launcher: then no plan is taken)."""
    lock = Path(run_dir) / LOCK_FILE
    try:
        return f"{lock.read_text(errors='replace').strip()} ({lock.stat().st_mtime_ns})"
    except OSError:
        return ""
