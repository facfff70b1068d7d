"""The launcher's plan for a store with NaN, read by the ranks instead of the store
(training/data/read_plan.py)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import training.data.dataset as dataset_module
from tests.training.data.test_gappy_points import (
    COLUMNS,
    LAND,
    ROWS,
    STATION,
    _gappy_store,
    _store_with_a_partial_field,
)
from training.data import ZarrDataset
from training.data.dataset import DatasetError
from training.data.read_plan import LOCK_FILE, PLAN_FILE
from training.launch.run_lock import LOCK_NAME, RunDirLock


def _no_scan(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the store was scanned although a plan for it was given")

    monkeypatch.setattr(dataset_module, "scan_points", refuse)


def _launched(tmp_path, store, **chosen) -> ZarrDataset:
    """The store as the launcher opens it, its plan left in ``tmp_path`` under a held lock."""
    dataset = ZarrDataset(store, **chosen)
    dataset.save_read_plan(tmp_path)
    assert (tmp_path / PLAN_FILE).exists()
    return dataset


def test_the_plan_names_the_lock_the_launcher_holds():
    assert LOCK_FILE == LOCK_NAME


def test_a_rank_reads_by_the_launchers_plan_without_scanning_the_store(tmp_path, monkeypatch):
    store, land = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    with RunDirLock(tmp_path):
        launcher = _launched(tmp_path, store)
        _no_scan(monkeypatch)
        rank = ZarrDataset(store, plan_dir=tmp_path)
    assert rank.missing == launcher.missing == {3, 10} and rank.variables == launcher.variables
    assert rank.read_plan.finite and rank.field_shape == launcher.field_shape == (len(land),)
    np.testing.assert_array_equal(np.sort(rank.stored_points), land)
    for name in ("stored_points", "latitudes", "area_weights", "output_mean"):
        np.testing.assert_array_equal(getattr(rank, name), getattr(launcher, name))
    np.testing.assert_array_equal(rank.state(11), launcher.state(11))


def test_a_plan_with_a_field_left_out_is_read_with_the_same_variables_and_roles(tmp_path, monkeypatch):
    store = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)
    chosen = dict(forcing=["tracer"], diagnostic=["v"])
    with RunDirLock(tmp_path):
        launcher = _launched(tmp_path, store, **chosen)
        assert launcher.read_plan.variables == ("psi", "zeta", "v", "tracer")
        _no_scan(monkeypatch)
        rank = ZarrDataset(store, **chosen, plan_dir=tmp_path)
    assert rank.variables == launcher.variables and rank.n_points == ROWS * COLUMNS
    assert rank.roles == launcher.roles and rank.roles.forcing != launcher.roles.prognostic_columns()
    np.testing.assert_array_equal(rank.output_mean, launcher.output_mean)
    np.testing.assert_array_equal(rank.state(5), launcher.state(5))


def test_a_plan_for_other_variables_another_store_or_launch_is_not_used(tmp_path, caplog):
    store = _store_with_a_partial_field(tmp_path / "sst.zarr", lacking_columns=4)
    with RunDirLock(tmp_path):
        _launched(tmp_path, store)
        named = ZarrDataset(store, variables=["psi", "u"], plan_dir=tmp_path)  # u asked for: its points go
        assert named.variables == ["psi", "u"] and named.n_points == ROWS * (COLUMNS - 4)
        other, _ = _gappy_store(tmp_path / "other.zarr", {STATION: [3, 10]})
        assert ZarrDataset(other, plan_dir=tmp_path).missing == {3, 10}
    assert caplog.text.count("was written for another store, variables or launch") == 2


def test_a_plan_left_by_an_earlier_launch_is_not_used_on_the_store_changed_since(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    with RunDirLock(tmp_path):
        _launched(tmp_path, store)
    # A third gap date (same shape and attributes): its 3 of 24 dates are over 10%, the station goes.
    zarr.open_group(str(store), mode="a")["data"][12, 0, 0, STATION] = np.nan
    with RunDirLock(tmp_path):  # the next launch rewrites the lock
        rank = ZarrDataset(store, plan_dir=tmp_path)
    assert not rank.missing and rank.n_points == LAND - 1 and STATION not in rank.stored_points


def test_without_a_launchers_lock_no_plan_is_taken(tmp_path):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    with RunDirLock(tmp_path):
        _launched(tmp_path, store)
    (tmp_path / LOCK_FILE).unlink()
    assert ZarrDataset(store, plan_dir=tmp_path).missing == {3, 10}


def test_a_damaged_plan_means_a_scan_with_a_warning(tmp_path, caplog):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    with RunDirLock(tmp_path):
        (tmp_path / PLAN_FILE).write_bytes(b"not a plan")
        dataset = ZarrDataset(store, plan_dir=tmp_path)
    assert dataset.missing == {3, 10}
    assert f"cannot read {tmp_path / PLAN_FILE}" in caplog.text


def test_a_plan_that_cannot_be_written_costs_a_warning_not_the_run(tmp_path, caplog):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    ZarrDataset(store).save_read_plan(tmp_path / "no_such_dir")
    assert "each rank will scan the store itself" in caplog.text
    assert not list(tmp_path.glob("**/*.part"))


def test_check_finite_reads_the_store_again_only_where_the_scan_saw_an_inf(tmp_path, monkeypatch):
    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    zarr.open_group(str(store), mode="a")["data"][7, 1, 0, 108] = -np.inf  # a land point
    with RunDirLock(tmp_path):
        with_inf = _launched(tmp_path, store)
        assert not with_inf.read_plan.finite and not ZarrDataset(store, plan_dir=tmp_path).read_plan.finite
    with pytest.raises(DatasetError, match=r"non-finite value -inf .* variable 'zeta'.*\(index 7\), point 108 "):
        with_inf.check_finite()
    zarr.open_group(str(store), mode="a")["data"][7, 1, 0, 108] = 0.0
    clean = ZarrDataset(store)
    assert clean.read_plan.finite
    monkeypatch.setattr(clean, "blocks", lambda *a, **k: pytest.fail("check_finite read the store again"))
    clean.check_finite()


def test_a_run_on_one_rank_scans_the_store_once(tmp_path, monkeypatch):
    from tests.training.conftest import small_config
    from training.app import run

    store, _ = _gappy_store(tmp_path / "gappy.zarr", {STATION: [3, 10]})
    scans, scan = [], dataset_module.scan_points
    monkeypatch.setattr(dataset_module, "scan_points", lambda *args: scans.append(args) or scan(*args))
    settings = ["data.grid=null", "model.hidden_grid=data", "evaluate.at_end_of_training=false", "trainer.steps=2"]
    settings += ["logging.mlflow=false", "strategy=none", "trainer.nprocs=1", "trainer.ranks_per_model=1"]
    run(small_config(tmp_path / "run", store, *settings))  # the launcher and its one rank in this process
    assert len(scans) == 1 and (tmp_path / "run" / PLAN_FILE).exists()
