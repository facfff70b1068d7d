"""Store points without a value at every date: the sea of a land-only product (E-OBS, ERA5-Land),
a station that stopped reporting. anemoi-datasets writes them as NaN in a store built with
``build.allow_nans`` (the store's ``allow_nans`` attribute says so); anemoi-training fills them
(its imputers) and masks them out of the loss. Here they are left out of the grid: the model is
given, trains on and is scored on the points that hold a value of every variable at every date
that is not a missing date.

A point with values on some dates only is left out too while such points are few: where more
than :data:`MAX_PARTIAL_SHARE` of the points lack a value on some dates only, those are dates
with no data that the store's ``missing_dates`` should list, and the reader says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

log = logging.getLogger(__name__)

MAX_PARTIAL_SHARE = 0.1  # of the store's points: more lacking a value on some dates only is refused


def points_with_values(blocks: Iterable[tuple[range, int, np.ndarray, range]], n_stored: int, where: str) -> np.ndarray:
    """Indices (ascending, the store's order) of the ``n_stored`` points with a finite value of
    every variable at every present date, from ``blocks`` ``(dates, p0, (dates, variables,
    members, points p0..), span)`` of the whole store (:meth:`ZarrDataset.blocks
    <training.data.dataset.ZarrDataset.blocks>`); logs what is left out. Raises ``DatasetError``
    naming ``where`` when the gaps are dates with no data, or fewer than 3 points are left."""
    from training.data.dataset import DatasetError  # the reader imports this module

    complete = np.ones(n_stored, dtype=bool)
    valued: np.ndarray | None = None  # (variables, points): any value at any date
    for _, p0, block, _ in blocks:
        finite, span = np.isfinite(block), slice(p0, p0 + block.shape[-1])
        complete[span] &= finite.all(axis=(0, 1, 2))
        if valued is None:
            valued = np.zeros((block.shape[1], n_stored), dtype=bool)
        valued[:, span] |= finite.any(axis=(0, 2))
    never = ~valued.all(axis=0) if valued is not None else np.zeros(n_stored, dtype=bool)
    partial = ~complete & ~never
    if partial.sum() > MAX_PARTIAL_SHARE * n_stored:
        raise DatasetError(
            f"{where}: {int(partial.sum())} of {n_stored} points (e.g. point {int(np.argmax(partial))}) have no value "
            "on some dates only: dates with no data must be listed in the store's missing_dates"
        )
    kept = np.flatnonzero(complete)
    if len(kept) < 3:
        raise DatasetError(
            f"{where}: only {len(kept)} of {n_stored} points have a value of every variable at every date"
        )
    if len(kept) < n_stored:
        log.info(
            "%s: %d of %d points left out of the grid: %d with no value of some variable at any date (e.g. the sea of "
            "a land-only product), %d with none on some dates",
            where,
            n_stored - len(kept),
            n_stored,
            int(never.sum()),
            int(partial.sum()),
        )
    return kept
