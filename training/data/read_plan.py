"""What a store that allows NaN is read as, found once a run and shared by its ranks.

Finding it means reading the whole store (:func:`~training.data.gappy_points.scan_points`). The
launcher does that once, before any rank starts, and writes the plan into the run directory
(:data:`PLAN_FILE`); every rank, spawned locally, under torchrun or in the launcher's own
process, reads the plan instead of the store. A plan is used only for the store and the
variables it was made for (:func:`plan_key`); any other, a missing file or an unreadable one
means the rank scans the store itself, as before.

The scan also notes whether the store holds an inf (``build.allow_nans`` allows NaN only). Where
it holds none, every value the run reads is finite by the plan's making, so the launcher's
``check_finite`` need not read the store a second time.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PLAN_FILE = "store_read_plan.npz"  # in the run directory


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


def plan_key(where: str, shape: tuple[int, ...], variables, forcing, diagnostic) -> str:
    """What a plan was made for: the store (its path or ``open_dataset`` spec, and its shape) and
    the run's ``data.variables``, ``data.forcing`` and ``data.diagnostic``."""
    chosen = {"variables": variables, "forcing": forcing, "diagnostic": diagnostic}
    return json.dumps({"store": where, "shape": list(shape), **{k: list(v or []) for k, v in chosen.items()}})


def save_plan(plan: ReadPlan, key: str, run_dir: str | Path) -> Path:
    """Write ``plan`` for ``key`` into ``run_dir`` (atomically: a rank never reads half a file)."""
    path = Path(run_dir) / PLAN_FILE
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    with open(partial, "wb") as f:
        np.savez(
            f,
            key=np.array(key),
            variables=np.array(plan.variables, dtype=str),
            kept=plan.kept.astype(np.int64),
            missing=np.array(sorted(plan.missing), dtype=np.int64),
            finite=np.array(plan.finite),
        )
    partial.replace(path)
    return path


def load_plan(key: str, run_dir: str | Path | None) -> ReadPlan | None:
    """The plan in ``run_dir`` made for ``key``; None where there is none, or it was made for
    another store or other variables, or cannot be read."""
    if run_dir is None:
        return None
    path = Path(run_dir) / PLAN_FILE
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["key"]) != key:
                log.debug("%s was made for another store or variables: scanning the store", path)
                return None
            return ReadPlan(
                tuple(str(v) for v in saved["variables"]),
                np.asarray(saved["kept"], dtype=np.int64),
                frozenset(int(t) for t in saved["missing"]),
                bool(saved["finite"]),
            )
    except FileNotFoundError:
        return None
    except Exception as exc:  # a damaged file is no worse than none: the store is scanned
        log.warning("cannot read %s (%s): scanning the store", path, exc)
        return None
