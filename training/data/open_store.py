"""The configured dataset, opened and checked against the configuration before any rank trains:
its grid, its dates, and the samples the lead time, members and rollout leave."""

from __future__ import annotations

from pathlib import Path

from training.config.schema import DataConfig
from training.data.anemoi_source import AnemoiDataset
from training.data.dataset import DatasetError, ZarrDataset
from training.data.grid_check import check_grid, infer_grid
from training.data.samples import Samples, build_samples, lead_steps, select_members


def open_dataset(data: DataConfig, horizon: int = 1, history: int = 0, store: ZarrDataset | None = None) -> ZarrDataset:
    """Open the configured dataset (``data.open_dataset`` through anemoi-datasets, else the store at
    ``data.path``) and check it against the configuration: its grid by coordinates, the lead
    time against its frequency, the members, and that there are samples of ``horizon``
    forecast steps (:func:`training.model.rollout.rollout_horizon`).

    ``data.grid: null`` is inferred from the store and written into ``data`` (the resolved
    configuration records the grid it trained on). ``store``: the store :func:`open_store` opened
    already for ``data`` (the launcher's, so that it is read once), else opened here.
    """
    dataset = store if store is not None else open_store(data)
    coordinates = (dataset.point_set, dataset.latitudes, dataset.longitudes)
    if data.grid is None:
        data.grid = infer_grid(*coordinates, dataset.resolution)
    else:
        check_grid(*coordinates, data.grid, str(dataset.path))
    if dataset.n_times < 8:
        raise DatasetError(f"{dataset.path} has {dataset.n_times} dates; training needs at least 8")
    dataset_samples(data, dataset, horizon, history)  # fails here on a bad lead_time, members or rollout
    return dataset


def open_store(data: DataConfig, plan_dir: str | Path | None = None) -> ZarrDataset:
    """The configured store as it is, unchecked: ``data.open_dataset`` through anemoi-datasets,
    else the store at ``data.path``. A store that allows NaN is read by the plan the launcher
    left in ``plan_dir`` (the run directory) where there is one for it, else scanned
    (:mod:`training.data.read_plan`)."""
    if data.open_dataset:
        return AnemoiDataset(data.open_dataset, data.variables, data.forcing, data.diagnostic, plan_dir)
    if data.path is None:
        raise DatasetError(
            "data.path is not set: give an anemoi-datasets store (data.path=/path/to/store.zarr) or data.open_dataset"
        )
    return ZarrDataset(data.path, data.variables, data.forcing, data.diagnostic, plan_dir)


def dataset_samples(data: DataConfig, dataset: ZarrDataset, horizon: int = 1, history: int = 0) -> Samples:
    """The train and validation samples of ``dataset`` under ``data.lead_time`` and ``data.members``
    whose ``horizon`` successive targets are present (see :mod:`training.data.samples`)."""
    lead = lead_steps(data.lead_time, dataset.frequency_s, str(dataset.path))
    members = select_members(dataset.n_members, data.members)
    held_out = data.calibration_fraction or 0.0  # None (not yet derived): none
    return build_samples(dataset.n_times, dataset.missing, members, lead, data.val_fraction, horizon, history, held_out)
