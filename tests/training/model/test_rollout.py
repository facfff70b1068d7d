"""The rollout loss: its schedule, its weights, and the same loss and gradients on any number of
ranks and strategies as on one rank."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import torch

from processor import ProcessorConfig, TransformerProcessor
from processor.distributed import ShardLayout, Transport, shard_sizes, sum_model_parallel_gradients
from processor.grids import get_grid
from processor.point_sets import point_set
from processor.strategies import ShardHybrid
from training.config.checks import check_config
from training.config.schema import LossConfig, RolloutConfig, RunConfig, TrainerConfig
from training.config.settings import check_ranges
from training.loop.step import TrainStep
from training.model import Forecaster, ShardedGrids
from training.model.rollout import loss_weights, rollout, step_weights

VARIABLES = ["u", "v", "tracer"]
STEPS = 3


def test_schedule_raises_the_rollout_up_to_its_max():
    rollout = RolloutConfig(start=1, max=3, increase_every=4)
    assert [rollout.steps_at(s) for s in range(0, 14, 2)] == [1, 1, 2, 2, 3, 3, 3]
    assert rollout.most == 3
    fixed = RolloutConfig(start=2, max=5)  # no schedule: stays at start
    assert (fixed.steps_at(1000), fixed.most) == (2, 2)
    with pytest.raises(ValueError, match=r"trainer.rollout.start = 4 is above trainer.rollout.max = 2"):
        check_config(RunConfig(trainer=TrainerConfig(rollout=RolloutConfig(start=4, max=2))))


def test_step_weights_decay_and_average_one():
    assert step_weights(3) == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(step_weights(3, 0.5), [12 / 7, 6 / 7, 3 / 7])  # 1 : 1/2 : 1/4, mean 1
    assert step_weights(1, 0.5) == [1.0]  # one step: the plain loss


def test_a_decayed_rollout_loss_weighs_each_step_by_its_weight():
    """With ``step_decay``, a 3-step rollout's loss is its steps' mean squared errors weighed
    12 : 6 : 3 (over 21), where without it they weigh alike."""
    model = _model("none")
    x, y = _data()
    n = x.shape[0] * x.shape[1] * 3
    data, hidden = get_grid("o12"), get_grid("o6")
    grids = ShardedGrids.build(data.latitudes, data.longitudes, hidden, 1, 0, encoder_k=4, decoder_k=3)
    with torch.no_grad():
        forecasts = rollout(model, x, STEPS, grids, None, Transport(), nullcontext())
        per_step = np.array([float((f - t).pow(2).sum()) / n for f, t in zip(forecasts, y)])
        plain = TrainStep(model, None, None, 0.0, nullcontext(), n).loss(x, y, grids, None, Transport())
        decayed = TrainStep(model, None, None, 0.0, nullcontext(), n, step_decay=0.5).loss(
            x, y, grids, None, Transport()
        )
    np.testing.assert_allclose(float(plain), per_step.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(decayed), (per_step * [12, 6, 3]).sum() / 21, rtol=1e-5)
    assert abs(float(decayed) - float(plain)) > 1e-3 * float(plain)  # the weights moved the loss


def test_step_decay_out_of_range_or_without_a_rollout_is_refused():
    with pytest.raises(ValueError, match=r"trainer.rollout.step_decay = 0.0 is out of range"):
        check_ranges(TrainerConfig(rollout=RolloutConfig(max=3, step_decay=0.0)), "trainer.")
    one_step = RunConfig(trainer=TrainerConfig(rollout=RolloutConfig(max=3, step_decay=0.5)))  # no raises
    with pytest.raises(ValueError, match=r"trainer.rollout.step_decay = 0.5 weighs a rollout's steps"):
        check_config(one_step)


def _weights(area: bool, variable_weights: dict, latitudes, points: slice):
    grid = get_grid("o12")
    areas = point_set(grid.latitudes, grid.longitudes).area_weights()
    return loss_weights(LossConfig(area, variable_weights), VARIABLES, areas, points)


def test_loss_weights_have_mean_one_and_name_bad_keys():
    lat = get_grid("o12").latitudes
    assert _weights(False, {}, lat, slice(None)) is None
    w = _weights(True, {"tracer": 2.0}, lat, slice(None)).double()
    assert w.shape == (len(lat), 3)
    np.testing.assert_allclose(w.mean(0).numpy(), [0.75, 0.75, 1.5], rtol=1e-6)  # area weights: mean 1
    assert float(w[0, 0]) < float(w[len(lat) // 2, 0])  # polar points weigh less than equatorial ones
    part = _weights(True, {}, lat, slice(10, 30))
    torch.testing.assert_close(part, _weights(True, {}, lat, slice(None))[10:30])
    with pytest.raises(ValueError, match=r"trainer.loss.variable_weights names \['q'\]"):
        _weights(False, {"q": 1.0}, lat, slice(None))
    with pytest.raises(ValueError, match="weights must be >= 0"):
        _weights(False, {"u": -1.0}, lat, slice(None))


def _model(strategy: str | ShardHybrid) -> Forecaster:
    torch.manual_seed(0)
    processor = TransformerProcessor(ProcessorConfig(2, 16, 4, window_size=30, strategy=strategy, num_chunks=0))
    return Forecaster(len(VARIABLES), 16, processor)


def _data():
    g = torch.Generator().manual_seed(1)
    n = get_grid("o12").n_points
    return torch.randn(2, n, 3, generator=g), torch.randn(STEPS, 2, n, 3, generator=g)


def _rollout_loss(model, x, y, ranks: int, rank: int, group, rows: slice):
    data, hidden = get_grid("o12"), get_grid("o6")
    grids = ShardedGrids.build(data.latitudes, data.longitudes, hidden, ranks, rank, encoder_k=4, decoder_k=3)
    weights = _weights(True, {"tracer": 3.0}, data.latitudes, rows)
    step = TrainStep(model, None, None, 0.0, nullcontext(), x.shape[0] * x.shape[1] * 3, weights)
    x_local = x[:, rows].clone().requires_grad_()
    loss = step.loss(x_local, y[:, :, rows], grids, group, Transport())
    loss.backward()
    return loss.item(), x_local.grad


def rollout_case(group, strategy: str | ShardHybrid) -> dict:
    import torch.distributed as dist

    rank, ranks = dist.get_rank(group), dist.get_world_size(group)
    model = _model(strategy)
    x, y = _data()
    layout = ShardLayout(tuple(shard_sizes(x.shape[1], ranks)), rank)
    rows = slice(layout.start, layout.stop)
    loss, dx = _rollout_loss(model, x, y, ranks, rank, model.processor.build_groups(group), rows)
    sum_model_parallel_gradients(model.parameters(), group)
    return {"loss": loss, "dx": dx.numpy(), "grads": {n: p.grad.numpy() for n, p in model.named_parameters()}}


@pytest.mark.parametrize(
    "strategy,ranks",
    [("shard_sequence", 2), ("shard_sequence", 3), ("shard_heads", 2), (ShardHybrid(head_group_size=2), 4)],
)
def test_rollout_loss_and_gradients_equal_one_rank(rank_pool, strategy, ranks):
    parts = rank_pool.run_ok(rollout_case, ranks, strategy)
    model = _model("none")
    x, y = _data()
    loss, dx = _rollout_loss(model, x, y, 1, 0, None, slice(None))
    one_step = _model("none")
    one_loss, _ = _rollout_loss(one_step, x, y[:1], 1, 0, None, slice(None))
    assert abs(loss - one_loss) > 1e-3 * one_loss  # the later steps do count
    np.testing.assert_allclose(sum(p["loss"] for p in parts), loss, rtol=1e-5)
    np.testing.assert_allclose(
        np.concatenate([p["dx"] for p in parts], 1), dx.numpy(), rtol=0, atol=1e-5 * float(dx.abs().max())
    )
    # Some gradients are zero up to round-off (the mappers' key bias: a softmax ignores a constant
    # added to all of a destination's scores): measure those against the model's largest gradient.
    floor = 1e-3 * max(float(p.grad.abs().max()) for p in model.parameters())
    for name, p in model.named_parameters():
        scale = max(float(p.grad.abs().max()), floor)
        np.testing.assert_allclose(parts[0]["grads"][name], p.grad.numpy(), rtol=0, atol=1e-5 * scale, err_msg=name)
