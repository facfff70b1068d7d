"""The field map of each lead (training/skill/field_leads.py): fitted only where a calibration
period is held out, and its forecast the regression's of that lead plus the map, worked by hand,
added beside the baselines' forecasts of that lead."""

from __future__ import annotations

import numpy as np
import pytest

from tests.training.skill.one_rank import one_rank_session
from training.data.open_store import dataset_samples
from training.model import field_forecast
from training.model.dual_ridge import LINEAR
from training.skill.baselines import training_baselines
from training.skill.field_leads import FIELD_MAP, fit_field_leads


@pytest.fixture
def few_samples_fit(monkeypatch):
    """The small store's 20-odd training samples are enough for the fit (1,024 on a real store)."""
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", 8)


def test_fitted_only_with_a_calibration_period(tmp_path, small_dataset, few_samples_fit):
    without = one_rank_session(tmp_path / "a", small_dataset, "data.calibration_fraction=0.0")
    assert fit_field_leads(without, training_baselines(without, 2, [])) is None
    session = one_rank_session(tmp_path / "b", small_dataset, "data.calibration_fraction=0.25")
    fields = fit_field_leads(session, training_baselines(session, 2, []))
    assert fields is not None and len(fields.maps) == 2


def test_each_lead_is_the_regression_plus_the_map_worked_by_hand(tmp_path, small_dataset, few_samples_fit):
    session = one_rank_session(tmp_path, small_dataset, "data.calibration_fraction=0.25")
    baselines = training_baselines(session, 2, [])
    fields = fit_field_leads(session, baselines)
    # the fitted samples: every training sample with two leads (fewer than the fit reads at most)
    train = dataset_samples(session.cfg.data, session.dataset, 2, 0).train
    inputs = [session.batches.forecast_inputs(t, m, 1)[0][0].cpu().numpy().ravel() for t, m in train]
    raw = np.stack(inputs).astype(np.float64)
    varies = np.flatnonzero(raw.std(axis=0) > 1e-6 * raw.std(axis=0).max())
    mean, scale = raw[:, varies].mean(axis=0), raw[:, varies].std(axis=0) * np.sqrt(len(varies))
    np.testing.assert_allclose(fields.samples, (raw[:, varies] - mean) / scale, rtol=1e-6, atol=1e-9)
    t, member = session.samples.calibration[0]
    x = session.batches.forecast_inputs(t, member, 1)[0][0].cpu().numpy()
    standard = (x.ravel()[varies] - mean) / scale
    distances = np.sum((fields.samples - standard) ** 2, axis=1)  # to each fitted sample
    dataset = session.dataset
    with_maps = fields.with_maps(t, member, baselines.forecasts(t, member))
    assert len(with_maps) == 2
    for k, (given, fit) in enumerate(zip(with_maps, fields.maps)):
        forecast = given[FIELD_MAP]
        forcings = session.batches.valid_forcings([(t, member)], 2)[k][0]
        expected = baselines.fitted.regressions[k].predict(np.concatenate([x, forcings], axis=-1)).ravel()
        for choice, columns, dual in fit.fits:
            kernel = fields.samples @ standard if choice.key == LINEAR else np.exp(-choice.key * distances)
            expected[columns] += kernel @ dual.coef + dual.offset
        np.testing.assert_allclose(forecast, dataset.denormalise_outputs(expected.reshape(forecast.shape)), rtol=1e-6)
