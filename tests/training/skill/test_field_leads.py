"""The field map of each lead (training/skill/field_leads.py): fitted only where a calibration
period is held out, and its forecast the regression's of that lead plus the map, worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.conftest import small_config
from training.distributed.parallel import ParallelDims
from training.launch.launcher import prepare
from training.model import field_forecast
from training.model.dual_ridge import LINEAR
from training.session import open_session
from training.skill import field_leads
from training.skill.baselines import training_baselines
from training.skill.field_leads import fit_field_leads

ONE_RANK = ("strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1")


def _session(tmp_path, small_dataset, *overrides):
    return open_session(prepare(small_config(tmp_path, small_dataset, *ONE_RANK, *overrides)), ParallelDims.build(1))


@pytest.fixture
def few_samples_fit(monkeypatch):
    """The small store's 20-odd training samples are enough for the fit (1,024 on a real store)."""
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", 8)


def test_fitted_only_with_a_calibration_period(tmp_path, small_dataset, few_samples_fit):
    without = _session(tmp_path / "a", small_dataset, "data.calibration_fraction=0.0")
    assert fit_field_leads(without, training_baselines(without, 2, [])) is None
    session = _session(tmp_path / "b", small_dataset, "data.calibration_fraction=0.25")
    fields = fit_field_leads(session, training_baselines(session, 2, []))
    assert fields is not None and len(fields.maps) == 2


def test_each_lead_is_the_regression_plus_the_map_worked_by_hand(tmp_path, small_dataset, few_samples_fit):
    session = _session(tmp_path, small_dataset, "data.calibration_fraction=0.25")
    baselines = training_baselines(session, 2, [])
    fields = fit_field_leads(session, baselines)
    t, member = session.samples.calibration[0]
    x = session.batches.forecast_inputs(t, member, 1)[0][0].cpu().numpy()
    standard = (x.ravel()[fields.kept] - fields.mean) / fields.scale
    distances = np.sum((fields.samples - standard) ** 2, axis=1)  # to each fitted sample
    dataset = session.dataset
    for k, (forecast, fit) in enumerate(zip(fields.forecasts(t, member), fields.maps)):
        forcings = session.batches.valid_forcings([(t, member)], 2)[k][0]
        expected = baselines.fitted.regressions[k].predict(np.concatenate([x, forcings], axis=-1)).ravel()
        for choice, columns, dual in fit.fits:
            kernel = fields.samples @ standard if choice.key == LINEAR else np.exp(-choice.key * distances)
            expected[columns] += kernel @ dual.coef + dual.offset
        np.testing.assert_allclose(forecast, dataset.denormalise_outputs(expected.reshape(forecast.shape)), rtol=1e-6)


def test_a_period_shorter_than_the_leads_leaves_it_out(tmp_path, small_dataset, few_samples_fit, monkeypatch):
    session = _session(tmp_path, small_dataset, "data.calibration_fraction=0.25")
    monkeypatch.setattr(field_leads, "calibration_period_samples", lambda session, steps: [])
    assert fit_field_leads(session, training_baselines(session, 2, [])) is None
