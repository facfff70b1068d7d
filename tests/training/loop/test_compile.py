"""``trainer.compile``: the compiled training step takes the eager step's numbers, to float32
rounding: the loss and every gradient of a rollout (measured: within 1e-6 of each gradient's
largest), and the losses of a few optimiser steps from the same start (not the parameters after
them: Adam's update of a gradient near 0 is the sign of its rounding)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.training.conftest import small_config
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.loop.trainer import Trainer
from training.session import open_session

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "logging.mlflow=false")


def _losses(cfg, steps: int) -> list[float]:
    """The losses of ``steps`` optimiser steps from the seed's parameters."""
    trainer = Trainer(open_session(cfg, ParallelDims.build(1)))
    return [trainer.one_step(step)["train/loss"] for step in range(steps)]


def _loss_and_gradients(trainer: Trainer, model: torch.nn.Module) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss of a rollout of two from the first training sample by ``model``, and the gradients."""
    s = trainer.session
    batch = s.batches([s.samples.train[0]], 2)
    step = copy.copy(trainer.step_fn)
    step.model = model
    s.model.zero_grad(set_to_none=True)
    loss = step.loss(batch.x, batch.targets, s.grids, s.model_group, s.transport, batch.forcings)
    loss.backward()
    return float(loss), {name: p.grad.clone() for name, p in s.model.named_parameters()}


@pytest.mark.slow
def test_the_compiled_step_takes_the_eager_steps_numbers(tmp_path, small_dataset):
    cfg = prepare(
        small_config(
            tmp_path / "run",
            small_dataset,
            *ONE_RANK,
            "model.trainable_size=4",
            "model.multistep_input=2",
            "trainer.rollout.max=2",
            "trainer.rollout.increase_every=2",
        )
    )
    trainer = Trainer(open_session(cfg, ParallelDims.build(1)))
    trainer.one_step(0)  # node parameters away from 0
    eager_loss, eager_grads = _loss_and_gradients(trainer, trainer.session.model)
    compiled_loss, compiled_grads = _loss_and_gradients(trainer, torch.compile(trainer.session.model))
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
    assert eager_grads.keys() == compiled_grads.keys() and len(eager_grads) > 20
    largest = max(float(g.abs().max()) for g in eager_grads.values())
    for name, want in eager_grads.items():
        # Keys' biases shift every score of a query alike: their gradient is 0 but for rounding.
        scale = max(float(want.abs().max()), 1e-3 * largest)
        torch.testing.assert_close(compiled_grads[name], want, rtol=0, atol=1e-4 * scale, msg=name)
    compiled_cfg = copy.deepcopy(cfg)
    compiled_cfg.trainer.compile = True  # the run's own switch: two steps of one forecast, two of two
    assert _losses(compiled_cfg, 4) == pytest.approx(_losses(cfg, 4), rel=1e-5)
