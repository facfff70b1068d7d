"""The statistics of what the model predicts: the change of each prognostic variable over one
lead time (anemoi's ``statistics_tendencies``).

The forecaster predicts each step's increment in units of these (``model.normalise_increments``),
as anemoi's tendency models do: a 6-hour change of 2 m temperature is a fraction of the field's
spread, and a head whose outputs start near unit size then starts near the right size.

Estimated from the training period alone, on normalised states (so in units of each variable's
field standard deviation), over at most :data:`DATES` start dates evenly spread, each rank
reading its own block of points and the sums taken over the model-parallel group: every rank of
every replica gets the same numbers.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from processor.distributed.transport import collective_device
from training.data.samples import evenly_spread

DATES = 64  # start dates the statistics are estimated from (evenly spread over the training period)


def tendency_statistics(
    dataset, starts: list[int], lead: int, points: slice, group: dist.ProcessGroup | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, stdev)`` ``(prognostic,)`` of ``state(t + lead) - state(t)`` (normalised; member 0)
    over ``starts`` (at most :data:`DATES` of them, evenly spread) and every point of the grid:
    this rank's ``points``, summed over ``group``. Every rank of ``group`` calls."""
    columns = dataset.roles.prognostic_columns()
    sums = np.zeros((3, len(columns)), dtype=np.float64)  # count, sum, sum of squares
    for t in evenly_spread(starts, DATES):
        change = (dataset.state(t + lead, points) - dataset.state(t, points))[:, columns].astype(np.float64)
        sums += [np.full(len(columns), len(change)), change.sum(0), (change**2).sum(0)]
    return pooled_mean_stdev(sums, group)


def pooled_mean_stdev(sums: np.ndarray, group: dist.ProcessGroup | None) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, stdev)`` ``(columns,)`` from this rank's ``sums`` ``(3, columns)`` (count, sum,
    sum of squares) added over ``group``; the stdev at least 1e-6. Every rank of ``group`` calls."""
    if group is not None and dist.get_world_size(group) > 1:
        total = torch.from_numpy(sums).to(collective_device(group))
        dist.all_reduce(total, group=group)
        sums = total.cpu().numpy()
    count = np.maximum(sums[0], 1)
    mean = sums[1] / count
    stdev = np.sqrt(np.maximum(sums[2] / count - mean**2, 0))
    return mean.astype(np.float32), np.maximum(stdev, 1e-6).astype(np.float32)
