"""The states a dataset read last, kept in memory up to a byte budget (:class:`StateCache`)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

# Normalised states kept in memory per dataset (each rank its own): a small store is read once
# (a read of one date from Zarr costs about 1 ms, most of a small grid's batch); a large one keeps
# the dates read last.
STATE_CACHE_BYTES = 1 << 30


class StateCache:
    """The states read last, up to ``capacity`` bytes, each read-only (a caller's change would
    reach the next reader)."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.size = capacity, 0
        self._states: OrderedDict[tuple, np.ndarray] = OrderedDict()

    def get(self, key: tuple) -> np.ndarray | None:
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
        return state

    def put(self, key: tuple, state: np.ndarray) -> np.ndarray:
        """Keep ``state`` (made read-only), dropping the least recently read beyond capacity."""
        state.setflags(write=False)
        if state.nbytes <= self.capacity:
            self._states[key] = state
            self.size += state.nbytes
            while self.size > self.capacity:
                self.size -= self._states.popitem(last=False)[1].nbytes
        return state
