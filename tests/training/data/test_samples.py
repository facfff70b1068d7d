"""Samples: lead time in hours against the store's frequency, ensemble members, missing dates."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr

from tests.training.conftest import small_config
from training.app import run
from training.config.schema import DataConfig
from training.data import DatasetError, ZarrDataset, generate_rossby_haurwitz
from training.data.open_store import dataset_samples, open_dataset
from training.data.samples import build_samples, lead_steps, select_members

SIX_HOURS = 6 * 3600


def test_one_member_no_missing_dates_is_the_old_indexing():
    """40 dates, 4 for validation: train starts 0..34, validation 36..38, target one step on."""
    samples = build_samples(40, frozenset(), [0], 1, 0.1)
    assert samples.train == [(t, 0) for t in range(35)]
    assert samples.val == [(t, 0) for t in range(36, 39)]


def test_a_calibration_period_lies_between_training_and_validation():
    """40 dates, the last 4 validation, the 8 before calibration (``data.calibration_fraction``):
    each period's inputs and targets inside it, so no training target is a calibration date."""
    samples = build_samples(40, frozenset(), [0], 1, 0.1, horizon=2, calibration_fraction=0.2)
    assert samples.train == [(t, 0) for t in range(26)]  # targets t + 1, t + 2 before date 28
    assert samples.calibration == [(t, 0) for t in range(28, 34)]
    assert samples.val == [(t, 0) for t in range(36, 38)]
    assert build_samples(40, frozenset(), [0], 1, 0.1).calibration == []


def test_lead_time_in_hours():
    assert lead_steps(None, SIX_HOURS) == 1
    assert lead_steps(6, SIX_HOURS) == 1
    assert lead_steps(24, SIX_HOURS) == 4
    assert lead_steps(1, 3600) == 1
    for bad in (9, 0, -6):
        with pytest.raises(DatasetError, match=rf"^data.lead_time = {bad} \(hours\) is not a positive multiple"):
            lead_steps(bad, SIX_HOURS)


def test_samples_touching_a_missing_date_are_skipped():
    samples = build_samples(40, frozenset({10}), [0, 1], 2, 0.1)
    starts = {t for t, _ in samples.train}
    assert 10 not in starts and 8 not in starts  # input missing, target missing
    assert {9, 11, 12} <= starts and max(starts) == 33  # targets stay before the validation dates
    assert samples.train[:2] == [(0, 0), (0, 1)]  # date-major, every member its own sample
    assert samples.val == [(36, 0), (36, 1), (37, 0), (37, 1)]


def test_earlier_inputs_are_present_in_the_same_period():
    """Two earlier inputs a lead of 2 dates apart (``model.multistep_input=3``), date 10 missing:
    a start needs dates t - 4, t - 2, t and t + 2, all in its period."""
    samples = build_samples(40, frozenset({10}), [0], 2, 0.25, horizon=1, history=2)  # validation: 30..39
    starts = {t for t, _ in samples.train}
    assert min(starts) == 4 and max(starts) == 27
    assert not starts & {8, 10, 12, 14}  # 10 is one of their dates
    assert {9, 11, 13, 15} <= starts
    assert [t for t, _ in samples.val] == [34, 35, 36, 37]


def test_members_are_checked():
    assert select_members(3, None) == [0, 1, 2]
    assert select_members(3, [2]) == [2]
    with pytest.raises(DatasetError, match=r"^data.members = \[3\]: the dataset has 3 ensemble members"):
        select_members(3, [3])


def test_no_sample_left_names_the_keys():
    with pytest.raises(DatasetError, match="no validation sample: .*data.lead_time"):
        build_samples(40, frozenset(), [0], 4, 0.1)


@pytest.fixture(scope="module")
def ensemble_store(tmp_path_factory):
    """2 members on o16, 24 dates, date 7 missing (NaN, listed in missing_dates)."""
    return generate_rossby_haurwitz(tmp_path_factory.mktemp("ens") / "ens.zarr", "o16", 24, 5, members=2, missing=(7,))


def test_members_and_missing_dates_in_the_reader(ensemble_store):
    ds = ZarrDataset(ensemble_store)
    assert ds.n_members == 2 and ds.missing == {7} and ds.frequency_s == SIX_HOURS
    assert not np.allclose(ds.state(3, member=0), ds.state(3, member=1))
    ds.check_finite()  # NaN only at the missing date: fine
    with pytest.raises(DatasetError, match="missing date"):
        ds.state(7)


def test_preloading_members_skips_the_missing_dates(ensemble_store):
    ds, fresh = ZarrDataset(ensemble_store), ZarrDataset(ensemble_store)
    blocks = [slice(0, 4), slice(4, 7), slice(8, 12), slice(12, 16), slice(16, 20), slice(20, 24)]
    assert ds._present_blocks(4) == blocks  # none spans date 7
    assert ds.preload(slice(None), [0, 1])
    for t, member in ((6, 1), (8, 0), (23, 1)):
        assert ds._states.get((t, member, None, None)) is not None
        np.testing.assert_array_equal(ds.state(t, member=member), fresh.state(t, member=member))
    with pytest.raises(DatasetError, match="missing date"):
        ds.state(7, member=1)


def test_open_dataset_checks_lead_time_and_members(ensemble_store):
    data = DataConfig(path=str(ensemble_store), grid=None, generate=False, val_fraction=0.25, lead_time=12)
    dataset = open_dataset(data)
    assert data.grid == "o16"  # inferred, and recorded in the configuration
    samples = dataset_samples(data, dataset)
    assert samples.lead == 2 and len(samples.train) == 2 * len({t for t, _ in samples.train})
    assert all(t not in (5, 7) for t, _ in samples.train)
    data.lead_time = 9
    with pytest.raises(DatasetError, match=r"data.lead_time = 9 \(hours\) is not a positive multiple .* \(6h\)"):
        open_dataset(data)
    data.lead_time, data.members = None, [0, 2]
    with pytest.raises(DatasetError, match=r"data.members = \[0, 2\]"):
        open_dataset(data)


def test_nonfinite_outside_the_missing_dates_names_the_member(tmp_path, ensemble_store):
    store = shutil.copytree(ensemble_store, tmp_path / "store.zarr")
    zarr.open_group(str(store), mode="a")["data"][9, 2, 1, 77] = np.inf
    with pytest.raises(DatasetError, match=r"variable 'u', member 1, date 2020-01-03T06:00:00 \(index 9\), point 77"):
        ZarrDataset(store).check_finite()


def test_training_on_members_a_missing_date_and_a_lead_time(tmp_path, ensemble_store):
    """The app, one rank: 2 members each its own sample, date 7 missing, 12 h lead, grid inferred."""
    overrides = ["data.grid=null", "data.lead_time=12", "data.val_fraction=0.25", "trainer.steps=3"]
    overrides += ["trainer.val_interval=3", "trainer.nprocs=1", "trainer.ranks_per_model=1", "strategy=none"]
    result = run(small_config(tmp_path, ensemble_store, *overrides, "logging.mlflow=false"))
    losses = [m["train/loss"] for _, m in result["history"]]
    assert len(losses) == 3 and np.isfinite(losses).all() and np.isfinite(result["history"][-1][1]["val/loss"])
