"""``model.climatology_input``: the means of the training dates by UTC hour, per point, given to
each step after the computed forcings of its dates; and a run that trains with it."""

from __future__ import annotations

import numpy as np
import torch

from processor.grids import get_grid
from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.data import ZarrDataset
from training.data.batches import Batches
from training.data.climatology_input import HourlyClimatology
from training.data.forcings import utc_hours
from training.model import ShardedGrids


def _dataset_and_points(small_dataset) -> tuple[ZarrDataset, slice]:
    dataset = ZarrDataset(small_dataset, None, ["cos_local_time"], ["v"])
    grids = ShardedGrids.build(dataset.latitudes, dataset.longitudes, get_grid("o8"), 2, 1, 4, 3)
    return dataset, slice(grids.data_layout.start, grids.data_layout.stop)


def test_the_climatology_is_the_training_dates_mean_by_utc_hour(small_dataset):
    dataset, points = _dataset_and_points(small_dataset)
    train = [(t, 0) for t in range(2, 14)]
    climatology = HourlyClimatology.fit(dataset, points, train)
    prognostic = dataset.roles.prognostic_columns()
    hours = utc_hours(dataset.dates[[t for t, _ in train]])
    assert len(set(hours)) > 1 and climatology.width == len(prognostic)
    for hour in set(hours):
        mine = [t for (t, _), h in zip(train, hours) if h == hour]
        want = np.mean([dataset.state(t, points)[:, prognostic] for t in mine], axis=0)
        np.testing.assert_allclose(climatology.at(dataset.dates[mine[0]]), want, rtol=1e-6)
    unseen = dataset.dates[train[0][0]] + np.timedelta64(1800, "s")  # half past: no training date has it
    np.testing.assert_allclose(climatology.at(unseen), np.mean(list(climatology.by_hour.values()), axis=0))


def test_each_step_is_given_the_climatology_of_its_dates_after_the_computed_forcings(small_dataset):
    dataset, points = _dataset_and_points(small_dataset)
    climatology = HourlyClimatology.fit(dataset, points, [(t, 0) for t in range(2, 14)])
    cpu = torch.device("cpu")
    plain = Batches(dataset, points, lead=1, device=cpu, valid_time_forcing=True)
    given = Batches(dataset, points, lead=1, device=cpu, valid_time_forcing=True, climatology=climatology)
    x0, _, f0 = plain([(5, 0)], steps=3)
    x, _, f = given([(5, 0)], steps=3)
    n, width = len(dataset.roles.prognostic_columns()), climatology.width
    assert x.shape[-1] == x0.shape[-1] + 2 * width and f.shape[-1] == f0.shape[-1] + 2 * width
    # the input: the states; at the input date the computed forcing, the climatology; the same at the valid date
    torch.testing.assert_close(x[..., :n], x0[..., :n], rtol=0, atol=0)
    torch.testing.assert_close(x[0, :, n + 1 : n + 1 + width], torch.from_numpy(climatology.at(dataset.dates[5])))
    torch.testing.assert_close(x[0, :, -width:], torch.from_numpy(climatology.at(dataset.dates[6])))
    torch.testing.assert_close(f[1, 0, :, -width:], torch.from_numpy(climatology.at(dataset.dates[8])))


def test_a_run_trains_with_the_climatology_as_input(tmp_path, small_dataset):
    settings = ["strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1", "trainer.steps=2"]
    run(small_config(tmp_path / "on", small_dataset, *settings, "model.climatology_input=true"))
    run(small_config(tmp_path / "off", small_dataset, *settings))
    on, off = (load_checkpoint(tmp_path / d / "checkpoints" / "latest.pt")["model"] for d in ("on", "off"))
    prognostic = on["head.1.weight"].shape[0]
    # the climatology of each prognostic variable at the input and at the valid date
    assert on["data_embed.weight"].shape[1] == off["data_embed.weight"].shape[1] + 2 * prognostic
