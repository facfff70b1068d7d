"""Forcings (store and computed) and diagnostics in a training run: 3 model-parallel ranks give
one rank's losses and parameters through a rollout fed the later dates' forcings; the skill
table scores the outputs beside the daily-cycle baselines; predictions hold the outputs."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from processor.grids import get_grid
from tests.training.conftest import small_config
from training.app import run
from training.checkpoint.files import load_checkpoint
from training.data import DatasetError, ZarrDataset
from training.data.batches import Batches
from training.data.forcings import computed_forcings
from training.model import ShardedGrids
from training.skill.climatologies import Climatologies
from training.skill.fitted import FITTED

FORCING = ["zeta", "cos_local_time", "sin_julian_day", "insolation"]  # one store variable, three computed
SETTINGS = [
    f"data.forcing=[{','.join(FORCING)}]",
    "data.diagnostic=[v]",
    "model.multistep_input=2",
    "trainer.rollout.start=2",
    "trainer.rollout.max=2",
    "trainer.steps=3",
]


def test_forcings_and_diagnostics_train_sharded_exactly(tmp_path, small_dataset):
    sharded = run(
        small_config(tmp_path / "sharded", small_dataset, *SETTINGS, "trainer.nprocs=3", "trainer.ranks_per_model=3")
    )
    single = run(
        small_config(
            tmp_path / "single",
            small_dataset,
            *SETTINGS,
            "strategy=none",
            "trainer.nprocs=1",
            "trainer.ranks_per_model=1",
        )
    )
    losses = [np.array([m["train/loss"] for _, m in result["history"]]) for result in (sharded, single)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    saved, reference = (
        load_checkpoint(tmp_path / d / "checkpoints" / "latest.pt")["model"] for d in ("sharded", "single")
    )
    prognostic = 3  # psi, u, tracer: zeta is a forcing, v a diagnostic
    # two states, the forcings at the input and the valid date, the position features
    assert reference["data_embed.weight"].shape[1] == 2 * prognostic + 2 * len(FORCING) + 4
    assert reference["head.1.weight"].shape[0] == prognostic + 1
    for name, value in reference.items():
        if not name.endswith(("k_norm.bias", "lin_key.bias")):  # round-off gradients, scaled up by Adam
            torch.testing.assert_close(saved[name], value, rtol=1e-3, atol=1e-5, msg=name)  # as test_app
    rows, sharded_rows = (_skill_rows(tmp_path / d) for d in ("single", "sharded"))
    assert {r["variable"] for r in rows} == {"psi", "u", "tracer", "v"}
    kinds = {"model", "persistence", "hourly_climatology", "anomaly_persistence", *FITTED}
    assert {r["kind"] for r in rows} >= kinds
    # Each rank fits the baselines on its own points, from the same inputs as the model's.
    for kind in FITTED:
        single_rmse, sharded_rmse = ([float(r["rmse"]) for r in t if r["kind"] == kind] for t in (rows, sharded_rows))
        assert len(single_rmse) == 4 * 2 and np.isfinite(single_rmse).all()  # 4 variables, 2 leads
        np.testing.assert_allclose(sharded_rmse, single_rmse, rtol=1e-5)


def _skill_rows(run_dir) -> list[dict[str, str]]:
    with open(run_dir / "skill.csv") as f:
        return list(csv.DictReader(f))


def test_anomaly_persistence_carries_the_initial_anomaly_to_the_valid_hour():
    dates = np.array(["2021-01-01T00", "2021-01-01T06", "2021-01-01T12"], dtype="datetime64[s]")
    clim = np.full((2, 1), 10.0)
    hourly = {0.0: np.full((2, 1), 8.0), 6.0: np.full((2, 1), 11.0), 12.0: np.full((2, 1), 14.0)}
    initial = np.array([[9.0], [7.0]])  # anomalies +1 and -1 at 00 UTC
    out = Climatologies(clim, hourly, None, dates).forecasts(initial, 0, 2)
    np.testing.assert_array_equal(out["hourly_climatology"], hourly[12.0])
    np.testing.assert_array_equal(out["anomaly_persistence"], [[15.0], [13.0]])
    np.testing.assert_array_equal(out["persistence"], initial)
    np.testing.assert_array_equal(out["climatology"], clim)


@pytest.mark.parametrize("valid_time", [False, True])
def test_batches_give_the_rollout_the_forcings_of_its_later_dates(small_dataset, valid_time):
    """Step ``k`` of a rollout from date 5 is given the forcings of its input date ``5 + k`` and,
    with ``model.valid_time_forcing``, of its valid date ``6 + k`` after them."""
    dataset = ZarrDataset(small_dataset, None, FORCING, ["v"])
    grids = ShardedGrids.build(dataset.latitudes, dataset.longitudes, get_grid("o8"), 2, 1, 4, 3)
    layout = grids.data_layout
    batches = Batches(
        dataset, slice(layout.start, layout.stop), lead=1, device=torch.device("cpu"), valid_time_forcing=valid_time
    )
    points, columns = batches.points, dataset.roles.columns
    x, targets, forcings = batches([(5, 0)], steps=3)
    n, given = points.stop - points.start, 4 * (2 if valid_time else 1)
    assert x.shape == (1, n, 3 + given) and targets.shape == (3, 1, n, 4) and forcings.shape == (2, 1, n, given)

    def forcings_at(t: int) -> np.ndarray:
        computed = computed_forcings(
            tuple(FORCING[1:]), dataset.dates[[t]], dataset.latitudes[points], dataset.longitudes[points]
        )
        return np.concatenate([dataset.state(t, points)[:, [columns["zeta"]]], computed[0]], axis=-1)

    np.testing.assert_array_equal(forcings[1, 0, :, :4].numpy(), forcings_at(7))
    np.testing.assert_array_equal(x[0, :, 3:7].numpy(), forcings_at(5))
    if valid_time:
        np.testing.assert_array_equal(forcings[1, 0, :, 4:].numpy(), forcings_at(8))
        np.testing.assert_array_equal(x[0, :, 7:].numpy(), forcings_at(6))
    np.testing.assert_array_equal(targets[2, 0].numpy(), dataset.state(8, points)[:, dataset.roles.output_columns()])
    given_x, given_forcings = batches.forecast_inputs(5, 0, 3)
    torch.testing.assert_close(given_x, x, rtol=0, atol=0)
    torch.testing.assert_close(given_forcings, forcings, rtol=0, atol=0)


def test_batches_give_the_model_its_earlier_states_oldest_first(small_dataset):
    """``model.multistep_input=3`` from date 5, a lead of 2 dates: the states of dates 1, 3 and 5,
    then the forcings of date 5; targets from date 7; no forecast before date 4."""
    dataset = ZarrDataset(small_dataset, None, FORCING, ["v"])
    grids = ShardedGrids.build(dataset.latitudes, dataset.longitudes, get_grid("o8"), 2, 0, 4, 3)
    layout = grids.data_layout
    batches = Batches(dataset, slice(layout.start, layout.stop), lead=2, device=torch.device("cpu"), history=2)
    points, prognostic = batches.points, dataset.roles.prognostic_columns()
    x, targets, _ = batches([(5, 0)], steps=2)
    n = len(prognostic)
    for k, t in enumerate((1, 3, 5)):
        np.testing.assert_array_equal(x[0, :, k * n : (k + 1) * n].numpy(), dataset.state(t, points)[:, prognostic])
    np.testing.assert_array_equal(targets[0, 0].numpy(), dataset.state(7, points)[:, dataset.roles.output_columns()])
    torch.testing.assert_close(batches.forecast_inputs(5, 0, 2)[0], x, rtol=0, atol=0)
    with pytest.raises(DatasetError, match=r"needs the 2 state\(s\) before it \(model.multistep_input = 3\)"):
        batches.forecast_inputs(3, 0, 2)
