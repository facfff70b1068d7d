"""The moving average of the parameters (``trainer.weight_average``): its arithmetic, the swap
in and out of the model, and a run that keeps one: validated, kept as best.pt, scored,
checkpointed and resumed exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.training.conftest import small_config
from training import evaluate
from training.app import run
from training.checkpoint.files import BEST, LATEST, load_checkpoint
from training.loop.weight_average import WeightAverage

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def test_the_average_follows_the_parameters_with_a_warming_decay():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    average = WeightAverage(model, decay=0.9)
    with torch.no_grad():
        model.weight.fill_(1.0)
    average.update()  # decay min(0.9, 2 / 11): the average moves 9/11 of the way
    np.testing.assert_allclose(average.average[0].numpy(), 9 / 11, rtol=1e-6)
    for _ in range(200):
        average.update()
    np.testing.assert_allclose(average.average[0].numpy(), 1.0, rtol=1e-6)
    assert average.updates == 201


def test_applied_swaps_the_average_in_and_back():
    model = nn.Linear(2, 1, bias=False)
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model.weight.fill_(3.0)
        average.average[0].fill_(1.0)
    with average.applied():
        assert float(model.weight.sum()) == 2.0  # the average's
        with torch.no_grad():
            model.weight.fill_(5.0)  # written into the average
    assert float(model.weight.sum()) == 6.0 and float(average.average[0].sum()) == 10.0
    average.copy_to_model()
    assert float(model.weight.sum()) == 10.0


def _average_of(checkpoint) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["average"]


@pytest.mark.slow
def test_a_run_with_an_average_resumes_exactly_and_scores_it(tmp_path, small_dataset):
    settings = (*ONE_RANK, "trainer.weight_average=0.9", "trainer.steps=6", "trainer.checkpoint_interval=100")
    whole = run(small_config(tmp_path / "whole", small_dataset, *settings))
    run(small_config(tmp_path / "parts", small_dataset, *settings, "trainer.stop_at_step=3"))
    parts = run(small_config(tmp_path / "parts", small_dataset, *settings))
    assert parts["start_step"] == 3
    one, other = (
        _average_of(tmp_path / "whole/checkpoints" / LATEST),
        _average_of(tmp_path / "parts/checkpoints" / LATEST),
    )
    for name in one:
        torch.testing.assert_close(other[name], one[name], rtol=1e-6, atol=1e-7)
    latest = load_checkpoint(tmp_path / "whole/checkpoints" / LATEST)
    assert latest["average_updates"] == 6
    assert any(not torch.equal(latest["model"][k], latest["average"][k]) for k in latest["model"])
    # best.pt holds the average validated, and the table scored at the end is of that model
    best = load_checkpoint(tmp_path / "whole/checkpoints" / BEST)
    assert "average" not in best
    scored = evaluate.run(
        small_config(
            tmp_path / "eval", small_dataset, *ONE_RANK, f"evaluate.checkpoint={tmp_path / 'whole/checkpoints' / BEST}"
        )
    )
    for want, got in zip(whole["skill"].rows, scored["skill"].rows):
        np.testing.assert_allclose(got.rmse, want.rmse, rtol=1e-5)
