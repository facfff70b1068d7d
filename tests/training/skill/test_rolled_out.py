"""The model rolled out a few samples at a time (training/skill/rolled_out.py): each sample's
forecasts and truths as its own rollout gives them, in physical units, the model's mode kept."""

from __future__ import annotations

import numpy as np
import torch

from tests.training.skill.one_rank import one_rank_session
from training.model.rollout import rollout
from training.skill import rolled_out as module
from training.skill.rolled_out import rolled_out, samples_per_rollout


def test_samples_per_rollout_fill_the_chunk_from_one_to_eight():
    assert samples_per_rollout(100) == 8
    assert samples_per_rollout(module.CHUNK_POINTS // 3) == 3
    assert samples_per_rollout(10 * module.CHUNK_POINTS) == 1


def test_each_sample_as_its_own_rollout_gives_it(tmp_path, small_dataset, monkeypatch):
    """Rolled out three at a time (a last chunk of two), every sample's forecast and truth at each
    lead is its own rollout's, denormalised; the model is left in training mode as it was."""
    session = one_rank_session(tmp_path, small_dataset)
    dataset, steps, samples = session.dataset, 2, session.samples.val[:5]
    monkeypatch.setattr(module, "CHUNK_POINTS", 3 * dataset.n_points)
    session.model.train()
    done = list(rolled_out(session, samples, steps))
    assert session.model.training and [d.sample for d in done] == samples
    assert not np.allclose(done[0].forecasts[0], done[1].forecasts[0])  # a sample's place matters
    session.model.eval()
    for d in done:
        x, targets, forcings = session.batches([d.sample], steps)
        with torch.no_grad():
            alone = rollout(
                session.model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
            )
        for k in range(steps):
            np.testing.assert_allclose(
                d.forecasts[k], dataset.denormalise_outputs(alone[k][0].numpy()), rtol=1e-5, atol=1e-5
            )
            np.testing.assert_array_equal(d.truths[k], dataset.denormalise_outputs(targets[k, 0].numpy()))
