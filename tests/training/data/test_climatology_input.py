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
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.model import ShardedGrids
from training.model.build import forcings_per_step
from training.session import open_session

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


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
    cfg = small_config(tmp_path / "on", small_dataset, *ONE_RANK, "trainer.steps=2", "model.climatology_input=true")
    result, cfg = run(cfg), prepare(cfg)  # prepared: the settings derived from the store
    assert all(np.isfinite(m["train/loss"]) for _, m in result["history"])
    saved = load_checkpoint(tmp_path / "on" / "checkpoints" / "latest.pt")
    roles = ZarrDataset(small_dataset, None, None, None).roles
    # two dates (input and valid), each: the computed forcings, then the climatology of each prognostic variable
    widths = len(roles.prognostic) * cfg.model.multistep_input + forcings_per_step(cfg, roles)
    assert forcings_per_step(cfg, roles) == 2 * (len(roles.forcing) + len(roles.computed) + len(roles.prognostic))
    assert saved["model"]["data_embed.weight"].shape[1] == widths + 4  # and the position features


def test_what_is_fitted_on_the_training_dates_does_not_depend_on_the_rollout(tmp_path, small_dataset):
    """Evaluation and prediction open their session with a horizon of one: the climatology and
    the linear baseline they fit must be training's, whose rollout is longer."""
    cfg = prepare(
        small_config(
            tmp_path,
            small_dataset,
            *ONE_RANK,
            "model.climatology_input=true",
            "model.baseline=linear_regression",
            "trainer.rollout.max=3",
        )
    )
    one, three = (open_session(cfg, ParallelDims.build(1), horizon) for horizon in (1, 3))
    assert len(three.samples.train) < len(one.samples.train)
    torch.testing.assert_close(three.model.linear_baseline.coef, one.model.linear_baseline.coef, rtol=0, atol=0)
    for hour, means in one.batches.climatology.by_hour.items():
        np.testing.assert_array_equal(three.batches.climatology.by_hour[hour], means)
