"""The dates of an anemoi-datasets store: its ``frequency`` attribute in seconds, its ``dates``
as ``datetime64[s]`` whatever they were written as, and the runs of dates present."""

from __future__ import annotations

import datetime
import re
from typing import Any

import numpy as np

_FREQUENCY = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "": 3600}


def frequency_seconds(value: Any) -> int:
    """Seconds of an anemoi frequency: ``"6h"``, ``"1d"``, ``"30m"``, ``6`` (hours) or a timedelta."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds())
    match = _FREQUENCY.match(str(value).lower())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"cannot read the frequency {value!r}: expected e.g. '6h', '1d', '30m' or hours")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def as_datetime64(dates: np.ndarray) -> np.ndarray:
    """``(time,)`` dates as ``datetime64[s]`` (integers are seconds since 1970, as gridshard once wrote)."""
    dates = np.asarray(dates)
    if np.issubdtype(dates.dtype, np.datetime64):
        return dates.astype("datetime64[s]")
    return dates.astype(np.int64).astype("datetime64[s]")


def present_runs(dates: range, missing: frozenset[int]) -> list[range]:
    """The runs of consecutive indices of ``dates`` that are not ``missing``."""
    runs, start = [], None
    for t in [*dates, None]:
        if t is not None and t not in missing:
            start = t if start is None else start
        elif start is not None:
            runs.append(range(start, t if t is not None else dates.stop))
            start = None
    return runs
