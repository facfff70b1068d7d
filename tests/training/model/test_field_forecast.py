"""The whole-field forecast the network is given (model.field_input): what the per-point
baseline leaves, forecast from a neighbour's input, which no per-point map can; each training
sample's forecast from a fit without its block of dates; never saved; refused where the points
are split over ranks or no regression is under it; derived on where one rank holds the grid."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.training.conftest import small_config
from training.config.checks import check_config
from training.config.schema import run_config
from training.config.settings import ConfigValueError
from training.model import field_forecast
from training.model.dual_ridge import DualFit
from training.model.field_forecast import (
    FOLDS,
    MIN_FIELD_SAMPLES,
    FieldForecast,
    field_samples_that_fit,
    fit_field_forecast,
)
from training.model.forecaster import Forecaster
from training.model.linear_baseline import LinearBaseline


class ShiftedBatches:
    """What the fit reads of a store (``batches(samples, steps)`` -> inputs, targets): 4 points of
    2 inputs each; each point's next value is its western neighbour's first input, plus noise;
    with ``squared``, a second output variable: that value's square, plus noise."""

    def __init__(self, n: int, seed: int, noise: float = 0.0, squared: bool = False) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(n, 4, 2)).astype(np.float32)
        shifted = np.roll(self.x[:, :, :1], 1, axis=1)
        outputs = np.concatenate([shifted, shifted**2], axis=-1) if squared else shifted
        self.targets = (outputs + noise * rng.normal(size=outputs.shape)).astype(np.float32)[None]

    def __call__(self, samples: list, steps: int = 1) -> SimpleNamespace:
        index = [t for t, _ in samples]
        return SimpleNamespace(x=torch.from_numpy(self.x[index]), targets=torch.from_numpy(self.targets[:, index]))


@pytest.fixture(autouse=True)
def _a_few_samples_fit(monkeypatch):
    """These stores hold a few hundred samples, where a real one needs MIN_FIELD_SAMPLES."""
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", 128)


def _nothing_per_point(outputs: int = 1) -> LinearBaseline:
    return LinearBaseline(torch.zeros(4, 3, outputs))  # learnt nothing: all is left to the field map


def test_the_field_forecast_gives_a_neighbours_value():
    batches = ShiftedBatches(300, seed=0)
    field = fit_field_forecast(batches, [(t, 0) for t in range(300)], _nothing_per_point())
    new = ShiftedBatches(20, seed=1)
    np.testing.assert_allclose(field(torch.from_numpy(new.x)).numpy(), new.targets[0], atol=0.05)
    assert field.state_dict() == {}  # never saved: fitted again from the store


def _kernel_by_hand(x: np.ndarray, key: float | str) -> np.ndarray:
    """The kernel between samples ``x (n, inputs)`` the fit chose (``key``), worked in numpy:
    standardised inputs scaled to a mean squared norm of 1, their Gram matrix or its Gaussian."""
    standard = (x - x.mean(0)) / (x.std(0) * np.sqrt(x.shape[1]))
    gram = standard @ standard.T
    if key == "linear":
        return gram
    norms = np.diag(gram)
    return np.exp(-key * (norms[:, None] + norms[None, :] - 2 * gram))


@pytest.mark.parametrize("linear_only", [True, False])
def test_a_training_sample_s_forecast_is_fitted_without_its_block_of_dates(linear_only, monkeypatch):
    """Inside ``out_of_fold`` each sample gets the map fitted on the other blocks (worked here,
    for each of two output variables, with the kernel and penalty the fit chose); outside, the
    map of every sample. A neighbour's square is not linear in the inputs: offered the Gaussian
    kernels, it takes one. Offered the linear kernel only, both variables share one map."""
    if linear_only:
        monkeypatch.setattr(field_forecast, "field_kernels", lambda gram, norms: {"linear": gram})
    n = 200
    batches = ShiftedBatches(n, seed=2, noise=0.1, squared=True)
    field = fit_field_forecast(batches, [(t, 0) for t in range(n)], _nothing_per_point(2))
    assert len(field.maps) == 1 if linear_only else field.maps[-1].key != "linear"
    x = batches.x.reshape(n, -1).astype(np.float64)
    targets = batches.targets[0].reshape(n, -1).astype(np.float64)  # columns point-major: (point, variable)
    penalties = [1e-3, 1e-2, 1e-1, 1.0, 10.0, 1e2, 1e3, 1e4]
    blocks = np.array_split(np.arange(n), FOLDS)
    samples = [5, 70, 150, 199]  # in blocks 0, 1, 3, 4
    with field.out_of_fold([(t, 0) for t in samples]):
        out_of_fold = field(torch.from_numpy(batches.x[samples])).numpy().reshape(len(samples), -1)
    every = field(torch.from_numpy(batches.x[samples])).numpy().reshape(len(samples), -1)
    for variable in (0, 1):
        columns = np.arange(variable, 8, 2)
        (key,) = [m.key for m in field.maps if set(columns) <= set(m.columns.tolist())]
        assert key != "linear" or variable == 0 or linear_only  # the square takes a Gaussian
        kernel = _kernel_by_hand(x, key)
        atol = 5e-4 if key == "linear" else 2e-3  # float32, and small penalties take large weights
        for row, t in enumerate(samples):
            rest = np.setdiff1d(np.arange(n), next(b for b in blocks if t in b))
            fits = [DualFit.fit(kernel[np.ix_(rest, rest)], targets[np.ix_(rest, columns)], p) for p in penalties]
            by_hand = [fit.predict(kernel[t : t + 1, rest])[0] for fit in fits]
            errors = [np.abs(out_of_fold[row, columns] - f).max() for f in by_hand]
            assert min(errors) < atol  # the penalty the fit chose; not the map of every sample:
            assert not np.allclose(out_of_fold[row, columns], every[row, columns], atol=1e-3)
    assert field.folds is None  # restored after the step


def test_a_training_step_reads_its_samples_remembered_forecasts(monkeypatch):
    """Remembered, each training sample's out-of-fold forecast of its own inputs is read, not
    computed, for the very tensor of inputs given to the step; other inputs (a rollout's later
    steps) and samples not remembered are computed; outside a step, the map of every sample."""
    n = 200
    batches = ShiftedBatches(n, seed=2, noise=0.1, squared=True)
    field = fit_field_forecast(batches, [(t, 0) for t in range(n)], _nothing_per_point(2))
    samples = [(5, 0), (70, 0), (150, 0), (199, 0)]
    given = torch.from_numpy(batches.x[[t for t, _ in samples]])
    with field.out_of_fold(samples):
        computed = field(given)
    field.remember(batches, [(t, 0) for t in range(n - 1)])  # every sample but the last
    assert field.remembered.shape == (n - 1, 4, 2)
    kernels = field._kernels

    def counted(flat):
        calls.append(len(flat))
        return kernels(flat)

    calls = []
    monkeypatch.setattr(field, "_kernels", counted)
    close = {"rtol": 1e-4, "atol": 1e-4}  # float32 products of other batch sizes round otherwise
    with field.out_of_fold(samples[:3], given=given[:3]):
        torch.testing.assert_close(field(given[:3]), computed[:3], **close)  # another tensor: computed
    assert calls == [3]
    calls.clear()
    with field.out_of_fold(samples[:3], given=(view := given[:3])):
        remembered = field(view)
        assert calls == []  # read, not computed
        later = field(remembered.clone())  # a rollout's next step: computed
        assert calls == [3]
    torch.testing.assert_close(remembered, computed[:3], **close)
    with field.out_of_fold(samples, given=given):  # (199, 0) is not remembered: computed
        torch.testing.assert_close(field(given), computed, **close)
    assert calls == [3, 4] and field.step_given is None and later.shape == (3, 4, 2)
    assert not torch.allclose(field(given), computed, atol=1e-3)  # outside a step: every sample's map
    with field.out_of_fold(samples[:3], given=view):
        view.mul_(2.0)  # edited in place after it was given: computed, not read
        edited = field(view)
    assert not torch.allclose(edited, remembered, atol=1e-3)
    assert calls == [3, 4, 4, 3]


def test_a_map_that_forecasts_nothing_held_out_is_left_out():
    """Targets that no input tells: the held-out tenth finds no gain, the forecast is the regression's."""
    batches = ShiftedBatches(300, seed=5)
    batches.targets = np.random.default_rng(6).normal(size=batches.targets.shape).astype(np.float32)
    field = fit_field_forecast(batches, [(t, 0) for t in range(300)], _nothing_per_point())
    assert field.maps == []
    with field.out_of_fold([(3, 0), (250, 0)]):
        assert not field(torch.from_numpy(batches.x[[3, 250]])).any()


def test_how_many_samples_fit(monkeypatch):
    monkeypatch.setattr(field_forecast, "MIN_FIELD_SAMPLES", MIN_FIELD_SAMPLES)  # the real one
    assert field_samples_that_fit(100, 10, 2, training=MIN_FIELD_SAMPLES - 1) == 0
    assert field_samples_that_fit(100, 10, 2, training=10_000) == 2048
    assert field_samples_that_fit(10_000, 105, 48, training=10_000) == 0  # a 48-field box of 10,000 points
    assert field_samples_that_fit(1617, 20, 1, training=636) == 0  # ERA5 UK's month of hours
    assert field_samples_that_fit(100, 10, 2, training=127) == 0


def test_refused_on_split_points_over_persistence_and_compiled(tmp_path, small_dataset):
    given = ("model.field_input=true", "model.baseline=linear_regression")
    cfg = run_config(small_config(tmp_path, small_dataset, *given))
    with pytest.raises(ConfigValueError, match="model.field_input = true reads every point on one rank"):
        check_config(cfg, world_size=2)
    cfg = run_config(small_config(tmp_path, small_dataset, "model.field_input=true", "model.baseline=persistence"))
    with pytest.raises(ConfigValueError, match="set model.baseline=linear_regression"):
        check_config(cfg, world_size=1)
    cfg = run_config(small_config(tmp_path, small_dataset, *given, "trainer.compile=true"))
    with pytest.raises(ConfigValueError, match="set trainer.compile=false, or model.field_input=false"):
        check_config(cfg, world_size=1)


def test_a_run_given_the_field_forecast_trains_and_its_checkpoint_scores_the_same(tmp_path, monkeypatch):
    """Derived on for a regional box on one rank; each training step's forecasts out of fold for
    its samples' dates; evaluating the checkpoint fits the field forecast again (it is not saved)
    and scores as the run did."""
    from hydra import compose, initialize_config_module

    from training import evaluate
    from training.app import run
    from training.checkpoint.files import load_training_checkpoint
    from training.data import write_rossby_haurwitz

    lats, lons = np.arange(40.0, 52.5, 1.0), np.arange(-8.0, 8.5, 1.0)
    box = np.repeat(lats, len(lons)), np.tile(lons, len(lats)) % 360
    store = write_rossby_haurwitz(tmp_path / "box.zarr", *box, steps=228, seed=4)
    short = ["model.num_layers=1", "model.num_channels=16", "model.num_heads=2", "model.window_size=16"]
    short += ["trainer.steps=4", "trainer.val_interval=2", "trainer.val_batches=1", "trainer.warmup_steps=1"]
    short += ["evaluate.steps=2", "evaluate.samples=4", "logging.mlflow=false", "logging.plots=false"]
    with initialize_config_module(config_module="configs", version_base="1.3"):
        trained = compose("config", [f"run_dir={tmp_path / 'run'}", "data=zarr", f"data.path={store}", *short])
        checkpoint = f"evaluate.checkpoint={tmp_path}/run/checkpoints/best.pt"
        scoring = [checkpoint, "data=zarr", f"data.path={store}", "evaluate.steps=2", "evaluate.samples=4"]
        scored = compose("config", [f"run_dir={tmp_path / 'eval'}", *scoring])
    given_folds = []  # what each training step's field forecasts are out of fold for
    out_of_fold = Forecaster.out_of_fold

    def spy(model, samples, given=None):
        given_folds.append([t for t, _ in samples])
        return out_of_fold(model, samples, given)

    forward = FieldForecast.forward
    read = []  # in each training step's forward, whether its field forecasts were read, not computed

    def spied_forward(field, x):
        if field.folds is not None and field.remembered is not None:  # a training step's, not remember's own
            read.append(field.step_given is not None and x is field.step_given[0])
        return forward(field, x)

    monkeypatch.setattr(FieldForecast, "forward", spied_forward)

    monkeypatch.setattr(Forecaster, "out_of_fold", spy)
    result = run(trained)
    assert len(given_folds) == 4 and all(0 <= t < 228 for starts in given_folds for t in starts)
    assert read == [True] * 4  # one forecast step a training step: every one read from memory
    _, saved = load_training_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    assert saved["model"]["field_input"] is True  # derived: one rank holds the box's 221 points
    again = evaluate.run(scored)["skill"]
    rows = {row[:3]: row.rmse for row in again.rows}
    assert len(rows) == len(result["skill"].rows)
    for row in result["skill"].rows:
        np.testing.assert_allclose(rows[row[:3]], row.rmse, rtol=1e-5)
