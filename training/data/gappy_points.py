"""Store points without a value at every date: the sea of a land-only product (E-OBS, ERA5-Land),
a station that did not report some days. anemoi-datasets writes them as NaN in a store built with
``build.allow_nans`` (the store's ``allow_nans`` attribute says so); anemoi-training fills them
(its imputers) and masks them out of the loss. Here nothing is filled; what has no value is not
read (:func:`plan_gaps`):

- a point with no value of some variable at any date (the sea) is left out of the grid;
- a point with no value on some dates only (a station's gaps) keeps its place, and those dates
  are read as missing dates (no sample reads them, as input or as target), while the dates so
  lost are at most :data:`MAX_GAP_DATES` of the store's; past that, the points with the most gaps
  are left out instead, the gappiest first, until they are.

A field with values over part of the grid only, where the store's other variables have values
everywhere (a sea-surface temperature, NaN over land, in a store of the atmosphere), is a
variable to leave out, not points: :func:`partial_fields` finds those that lack more than
:data:`MAX_MASKED_POINTS` of the points, and the reader leaves them out of the variables it reads
unless the run names them.

An inf is not a gap (``build.allow_nans`` allows NaN only): ``check_finite`` refuses it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

MAX_GAP_DATES = 0.1  # share of the present dates that a station's gaps may make missing
MAX_MASKED_POINTS = 0.1  # share of the points a field may lack before it, not they, is left out
MAX_GAP_CELLS = 2**27  # gappy points x dates tracked at once (a bool each): beyond, the store is refused


@dataclass(frozen=True)
class GapPlan:
    """What a store with gaps is read as: ``kept`` ``(kept points,)`` (ascending store indices of
    the points in the grid) and ``missing`` (the dates its kept points' gaps add to the missing
    dates)."""

    kept: np.ndarray
    missing: frozenset[int]


Blocks = Iterable[tuple[range, int, np.ndarray, range]]  # ZarrDataset.blocks: (dates, p0, block, span)


@dataclass(frozen=True)
class PointScan:
    """Which variable has a value at which store point: ``complete`` ``(variables, points)`` at
    every present date, ``valued`` at some date (:func:`scan_points`); ``finite``: no inf seen."""

    complete: np.ndarray
    valued: np.ndarray
    finite: bool = True

    def select(self, variables: list[int]) -> PointScan:
        """The scan ``(len(variables), points)`` of those variables (indices) alone (an inf seen in
        any variable is still reported: ``check_finite`` then finds it)."""
        return PointScan(self.complete[variables], self.valued[variables], self.finite)


def plan_gaps(read_blocks: Callable[[], Blocks], scan: PointScan, n_present: int, where: str) -> GapPlan:
    """The plan (see the module) for a store of ``n_present`` present dates and its ``scan``,
    ``read_blocks()`` giving its blocks ``(dates, p0, (dates, variables, members, points p0..),
    span)`` (:meth:`ZarrDataset.blocks <training.data.dataset.ZarrDataset.blocks>`), read again
    only where some points have gaps. Logs what it leaves out; ``ValueError`` naming ``where``
    when fewer than 3 points are left (the reader makes it a ``DatasetError``)."""
    n_stored = scan.valued.shape[1]
    complete, never = scan.complete.all(axis=0), ~scan.valued.all(axis=0)
    gappy = np.flatnonzero(~complete & ~never)
    if len(gappy) * max(n_present, 1) > MAX_GAP_CELLS:
        raise ValueError(
            f"{where}: {len(gappy)} points have no value on some dates: too many gaps to read around; select the "
            "variables that have values (data.variables), or rebuild the store without those points"
        )
    kept_gappy, missing = _kept_gappy(_gap_dates(read_blocks(), gappy), gappy, n_present)
    kept = np.sort(np.concatenate([np.flatnonzero(complete), kept_gappy]))
    if len(kept) < 3:
        raise ValueError(f"{where}: only {len(kept)} of {n_stored} points have values to train on")
    said = []
    if len(kept) < n_stored:
        said.append(
            f"{n_stored - len(kept)} of {n_stored} points left out of the grid ({int(never.sum())} with no value of "
            f"some variable at any date, e.g. the sea of a land-only product; {len(gappy) - len(kept_gappy)} with "
            "the most gaps)"
        )
    if missing:
        said.append(f"{len(missing)} dates with no value at a point kept read as missing dates")
    if said:
        log.info("%s: %s", where, "; ".join(said))
    return GapPlan(kept, frozenset(missing))


def partial_fields(scan: PointScan, variables: list[str], kept: set[str], constant: set[str], where: str) -> list[str]:
    """The ``variables`` (those of ``scan``) to leave out as fields over part of the grid (an SST
    over land), each logged: those with no value at any date at more than
    :data:`MAX_MASKED_POINTS` of the points where at least half of the varying variables (not in
    ``constant``: a land-sea mask has a value everywhere) have one, unless in ``kept`` (named by
    the run) or ``constant``. None where no varying variable outside ``kept`` would be left to
    predict: the plan then leaves the points out instead, as it does where a field lacks fewer."""
    varying = [i for i, name in enumerate(variables) if name not in constant]
    if not varying:
        return []
    covered = scan.valued[varying].mean(axis=0) >= 0.5  # (points,): where most fields have values
    lacking = (covered & ~scan.valued).sum(axis=1)  # (variables,)
    most = MAX_MASKED_POINTS * covered.sum()
    left_out = {
        name: int(n) for name, n in zip(variables, lacking) if n > most and name not in kept and name not in constant
    }
    if all(name in left_out or name in kept or name in constant for name in variables):
        return []
    for name, n in left_out.items():
        log.warning(
            "%s: %s left out of the variables read: no value at %d points where most variables have one (a field over "
            "part of the grid, e.g. a sea-surface temperature); name it in data.variables, data.forcing or "
            "data.diagnostic to read it, and those points are left out instead",
            where,
            name,
            n,
        )
    return list(left_out)


def scan_points(blocks: Blocks, n_variables: int, n_stored: int) -> PointScan:
    """The :class:`PointScan` ``(n_variables, n_stored)`` of a store from its ``blocks`` (see
    :func:`plan_gaps`): one read of every present date (none: every point complete)."""
    complete = np.ones((n_variables, n_stored), dtype=bool)
    valued = np.zeros((n_variables, n_stored), dtype=bool)
    any_date, no_inf = False, True
    for _, p0, block, _ in blocks:
        valid, span = ~np.isnan(block), slice(p0, p0 + block.shape[-1])  # an inf is an error: check_finite
        complete[:, span] &= valid.all(axis=(0, 2))
        valued[:, span] |= valid.any(axis=(0, 2))
        no_inf = no_inf and not np.isinf(block).any()
        any_date = True
    return PointScan(complete, valued if any_date else complete.copy(), no_inf)


def _gap_dates(blocks: Blocks, gappy: np.ndarray) -> dict[int, np.ndarray]:
    """``{date index: (len(gappy),) bool}``: at each date where one of the points ``gappy`` has no
    value of some variable, which do not."""
    gaps: dict[int, np.ndarray] = {}
    if not len(gappy):
        return gaps
    for run, p0, block, _ in blocks:
        inside = (gappy >= p0) & (gappy < p0 + block.shape[-1])
        if not inside.any():
            continue
        lacking = np.isnan(block[..., gappy[inside] - p0]).any(axis=(1, 2))  # (dates, those points)
        for i in np.flatnonzero(lacking.any(axis=1)):
            gaps.setdefault(run.start + int(i), np.zeros(len(gappy), dtype=bool))[inside] |= lacking[i]
    return gaps


def _kept_gappy(gaps: dict[int, np.ndarray], gappy: np.ndarray, n_present: int) -> tuple[np.ndarray, set[int]]:
    """The points of ``gappy`` kept, and the dates their gaps make missing: every one while those
    dates are at most :data:`MAX_GAP_DATES` of ``n_present``, else without the gappiest."""
    if not len(gappy):
        return gappy, set()
    dates = np.array(sorted(gaps))
    lacking = np.stack([gaps[t] for t in dates]) if len(dates) else np.zeros((0, len(gappy)), dtype=bool)
    keep = np.ones(len(gappy), dtype=bool)
    for worst in np.argsort(-lacking.sum(axis=0), kind="stable"):
        if lacking[:, keep].any(axis=1).sum() <= MAX_GAP_DATES * n_present:
            break
        keep[worst] = False
    return gappy[keep], {int(t) for t in dates[lacking[:, keep].any(axis=1)]}
