"""The launcher's plan for a store with NaN, read by the ranks instead of the store
(training/data/read_plan.py)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import training.data.dataset as dataset_module
from tests.training.data.test_gappy_points import COLUMNS, ROWS, STATION, _gappy_store, _store_with_a_partial_field
from training.data import ZarrDataset
from training.data.dataset import DatasetError
from training.data.read_plan import PLAN_FILE, load_plan, save_plan


def _no_scan(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the store was scanned although a plan for it was given")

    monkeypatch.setattr(dataset_module, "scan_points", refuse)


def test_a_rank_reads_by_the_launchers_plan_without_scanning_the_store(tmp_path, monkeypatch):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    launcher = ZarrDataset(store)
    assert save_plan(launcher.read_plan, launcher.read_plan_key, tmp_path) == tmp_path / PLAN_FILE
    _no_scan(monkeypatch)
    rank = ZarrDataset(store, plan_dir=tmp_path)
    assert rank.missing == launcher.missing == {3, 10} and rank.variables == launcher.variables
    np.testing.assert_array_equal(rank.stored_points, launcher.stored_points)
    np.testing.assert_array_equal(rank.latitudes, launcher.latitudes)
    np.testing.assert_array_equal(rank.area_weights, launcher.area_weights)
    np.testing.assert_array_equal(rank.state(11), launcher.state(11))


def test_a_plan_with_a_field_left_out_is_read_with_the_same_variables(tmp_path, monkeypatch):
    store = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)
    launcher = ZarrDataset(store)
    assert launcher.read_plan.variables == ("psi", "zeta", "v", "tracer")
    save_plan(launcher.read_plan, launcher.read_plan_key, tmp_path)
    _no_scan(monkeypatch)
    rank = ZarrDataset(store, plan_dir=tmp_path)
    assert rank.variables == launcher.variables and rank.n_points == ROWS * COLUMNS
    np.testing.assert_array_equal(rank.mean, launcher.mean)
    np.testing.assert_array_equal(rank.state(5), launcher.state(5))


def test_a_plan_for_other_variables_or_another_store_is_not_used(tmp_path):
    store = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)
    every = ZarrDataset(store)
    save_plan(every.read_plan, every.read_plan_key, tmp_path)
    named = ZarrDataset(store, variables=["psi", "u"], plan_dir=tmp_path)  # u asked for: its points go
    assert named.variables == ["psi", "u"] and named.n_points == ROWS * (COLUMNS - 4)
    other, _ = _gappy_store(tmp_path / "other.zarr", {STATION: [3, 10]})
    assert load_plan(ZarrDataset(other).read_plan_key, tmp_path) is None


def test_a_damaged_plan_means_a_scan_with_a_warning(tmp_path, caplog):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    (tmp_path / PLAN_FILE).write_bytes(b"not a plan")
    dataset = ZarrDataset(store, plan_dir=tmp_path)
    assert dataset.missing == {3, 10}
    assert f"cannot read {tmp_path / PLAN_FILE}" in caplog.text


def test_check_finite_reads_the_store_again_only_where_the_scan_saw_an_inf(tmp_path, monkeypatch):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    clean = ZarrDataset(store)
    assert clean.read_plan.finite
    monkeypatch.setattr(clean, "blocks", lambda *a, **k: pytest.fail("check_finite read the store again"))
    clean.check_finite()
    zarr.open_group(str(store), mode="a")["data"][7, 1, 0, 108] = -np.inf  # a land point
    with_inf = ZarrDataset(store)
    assert not with_inf.read_plan.finite
    with pytest.raises(DatasetError, match=r"non-finite value -inf .* variable 'zeta'.*\(index 7\), point 108 "):
        with_inf.check_finite()
