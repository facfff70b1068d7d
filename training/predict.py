"""``python -m training.predict``: forecasts of a saved forecaster to Zarr stores in the
anemoi-datasets layout.

python -m training.predict predict.checkpoint=outputs/.../checkpoints/latest.pt \
    'predict.initial_dates=["2020-03-01T00:00:00"]' predict.steps=20

The settings are the checkpoint's (model, data, strategy, ranks, precision:
:mod:`training.checkpoint.adopt`), with what this command line sets on top. One store per
initial date, ``<predict.output>/forecast_<date>.zarr`` (default output: the ``predictions/``
folder of the run that wrote the checkpoint), whose dates are the initial date plus 0, 1, ...
``steps`` leads (the first holds the initial state), in physical units, with the source
dataset's statistics and point order (its latitudes and longitudes, point by point).
The model-parallel ranks write their own blocks of points (no rank holds the whole grid);
data-parallel replicas take turns with the initial dates.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import DictConfig

from training.checkpoint.adopt import adopt_checkpoint
from training.checkpoint.resume import load_model_weights
from training.config.schema import RunConfig
from training.data import DatasetError
from training.data.forecast_store import ForecastStore
from training.distributed.device import to_device
from training.distributed.ranks import join_ranks
from training.launch import launcher
from training.launch.command import Command
from training.launch.launcher import run_reporting_errors
from training.launch.run_settings import command_line_keys
from training.model.rollout import rollout
from training.session import open_session

log = logging.getLogger(__name__)


def initial_indices(session, dates: list[str] | None) -> list[int]:
    """Date indices of ``predict.initial_dates`` (None: the first validation date), checked."""
    dataset = session.dataset
    if dates is None:
        return [session.samples.val[0][0]]
    indices = []
    for text in dates:
        try:
            wanted = np.datetime64(str(text), "s")
        except ValueError:
            raise DatasetError(f"predict.initial_dates: cannot read {text!r} as a date (2020-03-01T00:00)") from None
        found = np.flatnonzero(dataset.dates == wanted)
        if len(found) == 0 or int(found[0]) in dataset.missing:
            raise DatasetError(
                f"predict.initial_dates: {text} is not a date with data in {dataset.path} "
                f"({dataset.date(0)} .. {dataset.date(dataset.n_times - 1)}, every {dataset.frequency_s // 3600} h)"
            )
        indices.append(int(found[0]))
    return indices


def forecast_to_store(session, t: int, steps: int, output: Path, attributes: dict[str, Any]) -> Path:
    """Roll out ``steps`` leads from date index ``t`` and write them (with the initial state)
    to ``output/forecast_<date>.zarr``; collective over the model-parallel group."""
    dataset, dims = session.dataset, session.dims
    lead_s = session.samples.lead * dataset.frequency_s
    start = dataset.dates[t]
    dates = np.array([start + np.timedelta64(k * lead_s, "s") for k in range(steps + 1)], dtype="datetime64[s]")
    path = output / f"forecast_{str(start).replace(':', '')[:15]}.zarr"
    store = ForecastStore.create(
        path,
        variables=dataset.roles.outputs,
        latitudes=dataset.latitudes,
        longitudes=dataset.longitudes,
        dates=dates,
        frequency_s=lead_s,
        mean=dataset.output_mean,
        stdev=dataset.output_stdev,
        attributes={**attributes, "initial_date": str(start), **_source_points(dataset)},
        layout=session.grids.data_layout,
        group=dims.mp_group,
        transport=session.transport,
        order=dataset.point_set.order,  # the states are in the processor's order; the store in the source's
    )
    try:
        initial = dataset.state(t, session.points)[:, dataset.roles.output_columns()]
        store.write(0, _physical(dataset, to_device(initial, session.device)))
        x, forcings = session.batches.forecast_inputs(t, 0, steps)
        with torch.no_grad():
            states = rollout(
                session.model, x, steps, session.grids, session.model_group, session.transport, forcings=forcings
            )
            for k, state in enumerate(states):
                store.write(k + 1, _physical(dataset, state[0]))
    except KeyboardInterrupt:  # a half-written forecast would refuse the next run's: remove it
        if dims.mp_rank == 0:
            shutil.rmtree(store.writing_path, ignore_errors=True)
        raise
    store.close()
    return path


def _source_points(dataset) -> dict[str, list[int]]:
    """``source_points``: where the source store's points were partly left out
    (:mod:`training.data.gappy_points`), the store indices of those the forecast holds, in order."""
    kept = getattr(dataset, "stored_points", None)
    return {} if kept is None else {"source_points": [int(i) for i in kept]}


def _physical(dataset, state: torch.Tensor) -> torch.Tensor:
    """A normalised ``(local points, outputs)`` state in physical units, on its own device
    (the store exchanges its block edges there: CUDA under NCCL)."""
    mean = torch.as_tensor(dataset.output_mean, device=state.device)
    stdev = torch.as_tensor(dataset.output_stdev, device=state.device)
    return state * stdev + mean  # as ZarrDataset.denormalise_outputs computes it (float32)


def predict_on_rank(cfg: RunConfig) -> list[str]:
    """Every rank: load the checkpoint and write its share of the forecasts; return the stores."""
    dims, heartbeat = join_ranks(cfg.trainer)
    with heartbeat:
        session = open_session(cfg, dims)
        p_cfg = cfg.predict
        step = load_model_weights(p_cfg.checkpoint, cfg, dims, session.model)
        session.model.eval()
        # Beside the run that trained the model (checkpoints/latest.pt -> <that run>/predictions)
        output = Path(p_cfg.output or Path(p_cfg.checkpoint).parent.parent / "predictions").expanduser()
        attributes = {"checkpoint": p_cfg.checkpoint, "checkpoint_step": step, "source": str(session.dataset.path)}
        written = []
        for t in initial_indices(session, p_cfg.initial_dates)[dims.dp_rank :: dims.dp]:
            written.append(str(forecast_to_store(session, t, p_cfg.steps, output, attributes)))
        return written


def run(cfg: DictConfig | RunConfig, given: list[str] | None = None) -> list[str]:
    """:func:`predict_on_rank` on the configured ranks (local or torchrun), after the checks, with
    the checkpoint's settings under those the command line set (``given``; None: the API's
    configuration as it is, but for the model: :func:`training.checkpoint.adopt.adopt_checkpoint`)."""
    command = Command("predict", trains=False, adopt=lambda resolved: adopt_checkpoint(resolved, "predict", given))
    return launcher.run(cfg, command, predict_on_rank)


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    given = command_line_keys(multirun_members=True)
    kept = "the forecasts finished before it are kept, the one being written is removed"
    for path in run_reporting_errors(lambda c: run(c, given), cfg, interrupted=kept):
        log.info("wrote %s", path)


if __name__ == "__main__":
    from training.launch.launcher import main

    main(_hydra_main)
