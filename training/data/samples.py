"""Training samples: (start date index, ensemble member) pairs whose target is ``lead`` dates on.

- ``data.lead_time`` (hours; ``null``: one step of the store's frequency) must be a positive
  multiple of the store's frequency; the target of a sample at index ``t`` is ``t + lead``.
- Every selected ensemble member (``data.members``; ``null``: all) is a sample of its own:
  input and target come from the same member.
- A sample whose input or target date is one of the store's missing dates is skipped, as
  anemoi does.
- A rollout of ``horizon`` steps needs every target up to ``t + horizon * lead`` present.
- Train and validation are split by time: the last ``val_fraction`` of the dates (at least 2)
  are validation dates, the ``calibration_fraction`` before them (``data.calibration_fraction``,
  0 unless derived or given) a calibration period that only the skill table's calibration reads;
  a sample belongs to the period holding all its dates.

The sample lists are a function of the dataset and the configuration alone, so a resumed run
reads exactly the samples of the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from training.data.dataset import DatasetError
from training.data.forcings import utc_hours

Sample = tuple[int, int]  # (start date index, member)


@dataclass(frozen=True)
class Samples:
    """``train`` and ``val`` samples, date-major then member; ``lead`` dates between input and target."""

    train: list[Sample]
    val: list[Sample]
    lead: int
    calibration: list[Sample] = field(default_factory=list)  # the period between: the calibration's only


def evenly_spread(items: list, count: int) -> list:
    """At most ``count`` of ``items``, evenly spread from the first to the last, in order."""
    picks = np.unique(np.linspace(0, len(items) - 1, min(count, len(items))).round().astype(int))
    return [items[i] for i in picks]


def by_utc_hour(items: list, dates: np.ndarray, count: int) -> dict[float, list]:
    """``items`` grouped by the UTC hour of their ``dates`` (datetime64, one per item), hours in
    order, at most ``count`` items an hour (:func:`evenly_spread`)."""
    grouped: dict[float, list] = {}
    for item, hour in zip(items, utc_hours(dates)):
        grouped.setdefault(float(hour), []).append(item)
    return {hour: evenly_spread(group, count) for hour, group in sorted(grouped.items())}


def lead_steps(lead_time_h: int | None, frequency_s: int, where: str = "the dataset") -> int:
    """Dates between input and target for ``data.lead_time`` (hours, None: one step)."""
    if lead_time_h is None:
        return 1
    frequency_h = frequency_s / 3600
    seconds = int(lead_time_h) * 3600
    if lead_time_h <= 0 or seconds % frequency_s:
        raise DatasetError(
            f"data.lead_time = {lead_time_h} (hours) is not a positive multiple of the frequency of {where} "
            f"({frequency_h:g}h): use {frequency_h:g}, {2 * frequency_h:g}, ... or null for one step"
        )
    return seconds // frequency_s


def select_members(n_members: int, members: list[int] | None) -> list[int]:
    """The ensemble members to train on: ``data.members`` (None: every member), checked."""
    if members is None:
        return list(range(n_members))
    bad = [m for m in members if not 0 <= int(m) < n_members]
    if bad or not members or len(set(members)) != len(members):
        raise DatasetError(
            f"data.members = {list(members)}: the dataset has {n_members} ensemble members "
            f"(indices 0..{n_members - 1}); give distinct indices among them, or null for all"
        )
    return [int(m) for m in members]


def period_bounds(n_times: int, val_fraction: float, calibration_fraction: float = 0.0) -> tuple[int, int]:
    """The first calibration date and the first validation date of ``n_times`` dates: the last
    ``val_fraction`` of them (at least 2) validate, the ``calibration_fraction`` before calibrate."""
    boundary = n_times - max(2, int(n_times * val_fraction))
    return boundary - int(n_times * calibration_fraction), boundary


def build_samples(
    n_times: int,
    missing: frozenset[int],
    members: list[int],
    lead: int,
    val_fraction: float,
    horizon: int = 1,
    history: int = 0,
    calibration_fraction: float = 0.0,
) -> Samples:
    """The train and validation samples of a dataset of ``n_times`` dates (see the module) whose
    ``history`` earlier inputs (``t - history * lead``, ..., ``t - lead``; ``model.multistep_input``
    - 1) and ``horizon`` successive targets (``t + lead``, ..., ``t + horizon * lead``; a
    rollout's) are all present in the same period."""
    calibrated, boundary = period_bounds(n_times, val_fraction, calibration_fraction)
    n_val = n_times - boundary
    offsets = [k * lead for k in range(-history, horizon + 1)]

    def starts(first: int, stop: int) -> list[int]:
        return [t for t in range(first - offsets[0], stop - offsets[-1]) if not any(t + o in missing for o in offsets)]

    train = [(t, m) for t in starts(0, calibrated) for m in members]
    calibration = [(t, m) for t in starts(calibrated, boundary) for m in members]
    val = [(t, m) for t in starts(boundary, n_times) for m in members]
    if not train or not val:
        period = "training" if not train else "validation"
        held = boundary - calibrated
        held_out = f", {held} for calibration (data.calibration_fraction)" if held else ""
        raise DatasetError(
            f"no {period} sample: {n_times} dates, {n_val} of them for validation (data.val_fraction){held_out}, "
            f"{len(missing)} missing, {history} earlier input(s) and {horizon} step(s) of {lead} dates "
            "(model.multistep_input, data.lead_time); use a shorter data.lead_time, fewer rollout or evaluation "
            "steps, or another data.val_fraction"
        )
    return Samples(train, val, lead, calibration)
