"""The statistics of one lead time's change, by hand and over ranks; the forecaster's increment
in their units."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processor.distributed import shard_sizes
from training.data.forcings import VariableRoles
from training.data.tendencies import tendency_statistics


class _Dataset:
    """Normalised states ``(points, variables)``: ``a`` grows by ``t`` at every point, ``b`` by
    the point's index times ``t``, ``f`` (a forcing) is not a prognostic variable."""

    roles = VariableRoles.build(["a", "f", "b"], ["f"], None)

    def state(self, t: int, points: slice = slice(None)) -> np.ndarray:
        index = np.arange(6, dtype=np.float64)[points]
        return np.stack([np.full_like(index, 0.5 * t**2), np.full_like(index, 99.0), index * t], axis=1)


def test_the_change_over_a_lead_by_hand():
    """Starts 0 and 2, a lead of 2: ``a`` changes by 2 and 6 (mean 4, stdev 2); ``b`` by twice the
    point's index, 0..10, at both starts (mean 5, stdev sqrt(35/3))."""
    mean, stdev = tendency_statistics(_Dataset(), [0, 2], 2, slice(None), None)
    np.testing.assert_allclose(mean, [4.0, 5.0], rtol=1e-6)
    np.testing.assert_allclose(stdev, [2.0, np.sqrt(35 / 3)], rtol=1e-6)


def _on_rank(group, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    import torch.distributed as dist

    sizes, rank = shard_sizes(6, ranks), dist.get_rank(group)
    start = sum(sizes[:rank])
    return tendency_statistics(_Dataset(), [0, 2], 2, slice(start, start + sizes[rank]), group)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_rank_gets_the_one_rank_statistics(rank_pool, ranks):
    want = tendency_statistics(_Dataset(), [0, 2], 2, slice(None), None)
    for got in rank_pool.run_ok(_on_rank, ranks, ranks):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_the_forecaster_predicts_the_increment_in_its_units():
    """The same weights: with stdev 3 and mean 0.5 the increment is 3 x the head's, plus 0.5."""
    from processor import ProcessorConfig, TransformerProcessor
    from processor.grids import get_grid
    from training.model import Forecaster, ShardedGrids

    data, hidden = get_grid("o8"), get_grid("o4")
    grids = ShardedGrids.build(data.latitudes, data.longitudes, hidden, 1, 0, 4, 3)
    x = torch.randn(1, data.n_points, 2, generator=torch.Generator().manual_seed(0))

    def model(normalise: bool) -> Forecaster:
        torch.manual_seed(0)
        processor = TransformerProcessor(ProcessorConfig(1, 16, 2, window_size=8, strategy="none"))
        return Forecaster(2, 16, processor, mapper_heads=2, normalise_increments=normalise).eval()

    plain, scaled = model(False), model(True)
    scaled.set_increment_statistics(np.array([0.5, 0.5]), np.array([3.0, 3.0]))
    with torch.no_grad():
        head, own = plain(x, grids, None) - x, scaled(x, grids, None) - x
    torch.testing.assert_close(own, 3 * head + 0.5, rtol=1e-5, atol=1e-5)
    assert {"increment_mean", "increment_stdev"} <= set(scaled.state_dict())  # checkpoints keep them
