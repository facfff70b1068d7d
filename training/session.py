"""What training, evaluation and prediction set up alike on every rank: the dataset (checked
against the configuration), this rank's blocks of the grids, the model, and batches of this
rank's data points."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from processor import TransformerProcessor
from processor.distributed import CommCounter, GroupLike, HostStagedTransport, Transport, agree_on_values
from processor.runtime import Heartbeat, set_freed_memory_policy
from training.config.schema import (
    DataConfig,
    RunConfig,
    TrainerConfig,
    run_processor_config,
)
from training.config.settings import flatten, to_settings
from training.data import DatasetError, ZarrDataset
from training.data.dataset import STATE_CACHE_BYTES, StateCache
from training.data.forcings import VariableRoles, computed_forcings
from training.data.grid_check import check_grid, infer_grid
from training.data.samples import Sample, Samples, build_samples, lead_steps, select_members
from training.data.tendencies import tendency_statistics
from training.distributed.device import rank_device, to_device
from training.distributed.parallel import ParallelDims
from training.model import Forecaster, ShardedGrids
from training.model.hidden_grid import HiddenGrid, hidden_grid


def join_ranks(cfg: RunConfig) -> tuple[ParallelDims, AbstractContextManager]:
    """This rank's data- x model-parallel dims, and the heartbeat to run under on several ranks:
    when a collective fails because another rank died, hung or raised, this rank raises
    :class:`~processor.runtime.PeerFailureError` naming it, within ``trainer.timeout_s`` (plus
    three heartbeats)."""
    t_cfg = cfg.trainer
    dims = ParallelDims.build(t_cfg.ranks_per_model, t_cfg.placement)
    if dims.world == 1:
        return dims, nullcontext()
    return dims, Heartbeat.from_env(dims.rank, dims.world, t_cfg.heartbeat_s, t_cfg.timeout_s, dims.nodes)


def open_dataset(data: DataConfig, horizon: int = 1, history: int = 0) -> ZarrDataset:
    """Open the configured dataset (``data.open_dataset`` through anemoi-datasets, else the store at
    ``data.path``) and check it against the configuration: its grid by coordinates, the lead
    time against its frequency, the members, and that there are samples of ``horizon``
    forecast steps (:func:`rollout_horizon`).

    ``data.grid: null`` is inferred from the store and written into ``data`` (the resolved
    configuration records the grid it trained on).
    """
    if data.open_dataset:
        from training.data.anemoi_source import AnemoiDataset

        dataset: ZarrDataset = AnemoiDataset(data.open_dataset, data.variables, data.forcing, data.diagnostic)
    elif data.path is None:
        raise DatasetError(
            "data.path is not set: give an anemoi-datasets store (data.path=/path/to/store.zarr) or data.open_dataset"
        )
    else:
        dataset = ZarrDataset(data.path, data.variables, data.forcing, data.diagnostic)
    coordinates = (dataset.point_set, dataset.latitudes, dataset.longitudes)
    if data.grid is None:
        data.grid = infer_grid(*coordinates, dataset.resolution)
    else:
        check_grid(*coordinates, data.grid, str(dataset.path))
    if dataset.n_times < 8:
        raise DatasetError(f"{dataset.path} has {dataset.n_times} dates; training needs at least 8")
    dataset_samples(data, dataset, horizon, history)  # fails here on a bad lead_time, members or rollout
    return dataset


def rollout_horizon(trainer: TrainerConfig) -> int:
    """The most forecast steps one training sample needs (``trainer.rollout.max``)."""
    return max(1, trainer.rollout.max)


def dataset_samples(data: DataConfig, dataset: ZarrDataset, horizon: int = 1, history: int = 0) -> Samples:
    """The train and validation samples of ``dataset`` under ``data.lead_time`` and ``data.members``
    whose ``horizon`` successive targets are present (see :mod:`training.data.samples`)."""
    lead = lead_steps(data.lead_time, dataset.frequency_s, str(dataset.path))
    members = select_members(dataset.n_members, data.members)
    return build_samples(dataset.n_times, dataset.missing, members, lead, data.val_fraction, horizon, history)


def build_model(cfg: RunConfig, roles: VariableRoles, grids: ShardedGrids) -> Forecaster:
    """The forecaster of ``cfg``'s model and strategy for variables in ``roles`` on ``grids``
    (their sizes: one learned feature vector per point), its parameters drawn from torch's
    generator, whole: :meth:`Forecaster.split_node_parameters` keeps a rank's blocks."""
    processor = TransformerProcessor(run_processor_config(cfg))
    model = cfg.model
    return Forecaster(
        len(roles.prognostic),
        model.num_channels,
        processor,
        model.mapper,
        model.mapper_heads,
        forcings=(len(roles.forcing) + len(roles.computed)) * (2 if model.valid_time_forcing else 1),
        diagnostics=len(roles.diagnostic),
        multistep=model.multistep_input,
        node_parameters=(grids.data_layout.total, grids.hidden_layout.total, model.trainable_size),
        normalise_increments=model.normalise_increments,
    )


def check_ranks_agree(cfg: RunConfig, dataset: ZarrDataset, dims: ParallelDims) -> None:
    """Every rank must run the same resolved configuration on the same dataset: one all_gather
    of a hash, and the same ``ValueError`` on every rank, naming ranks and keys, if not."""
    if dims.world == 1:
        return
    values: dict[str, object] = {
        **flatten(to_settings(cfg)),
        "dataset.shape": (dataset.n_times, dataset.n_points),
        "dataset.members": dataset.n_members,
        "dataset.variables": dataset.variables,
        "dataset.missing_dates": len(dataset.missing),
        "dataset.dates": f"{dataset.date(0)}..{dataset.date(dataset.n_times - 1)}",
    }
    agree_on_values(values, what="configuration or dataset")


class Batch(NamedTuple):
    """One batch on this rank's points: the model's inputs, the rollout's targets, and the
    forcings the rollout's later steps are given (:class:`~training.data.forcings.VariableRoles`)."""

    x: torch.Tensor  # (batch, local points, inputs) at each sample's date
    targets: torch.Tensor  # (steps, batch, local points, outputs) at lead, ..., steps x lead dates on
    forcings: torch.Tensor  # (steps - 1, batch, local points, forcings) at lead, ..., (steps - 1) x lead


class Batches:
    """States of one member for this rank's block of data points: an input and the targets of a
    rollout, ``lead`` dates apart, on ``device``; computed forcings at each date, given to the
    step from it (and, ``valid_time_forcing``, to the step to it)."""

    def __init__(
        self,
        dataset: ZarrDataset,
        grids: ShardedGrids,
        lead: int,
        device: torch.device,
        valid_time_forcing: bool = False,
        history: int = 0,
    ) -> None:
        self.dataset = dataset
        self.lead = lead
        self.valid_time_forcing = valid_time_forcing
        self.history = history  # earlier states in the input: model.multistep_input - 1
        self.device = device
        layout = grids.data_layout
        self.points = slice(layout.start, layout.stop)
        self._forcings = StateCache(STATE_CACHE_BYTES // 4)  # computed forcings by date

    def __call__(self, samples: list[Sample], steps: int = 1) -> Batch:
        """The :class:`Batch` of ``samples`` for a rollout of ``steps``."""
        roles = self.dataset.roles
        states = np.stack(  # (history + steps + 1, batch, local points, variables)
            [
                np.stack([self.dataset.state(t + k * self.lead, self.points, m) for t, m in samples])
                for k in range(-self.history, steps + 1)
            ]
        )
        dates = np.array([[self.dataset.dates[t + k * self.lead] for t, _ in samples] for k in range(steps + 1)])
        x, forcings = self._inputs(states, dates)
        targets = states[self.history + 1 :][..., roles.output_columns()]
        return Batch(*(to_device(a, self.device) for a in (x, targets, forcings)))

    def forecast_inputs(self, t: int, member: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The input ``(1, local points, inputs)`` at date index ``t`` and the forcings ``(steps -
        1, 1, local points, forcings)`` of a forecast of ``steps`` leads, which may run past the
        store's last date when every forcing is computed."""
        dataset, roles = self.dataset, self.dataset.roles
        if t - self.history * self.lead < 0:
            raise DatasetError(
                f"a forecast from {dataset.date(t)} needs the {self.history} state(s) before it (model.multistep_input"
                f" = {self.history + 1}): start at {dataset.date(self.history * self.lead)} or later"
            )
        lead_s = self.lead * dataset.frequency_s
        dates = np.array([[dataset.dates[t] + np.timedelta64(k * lead_s, "s")] for k in range(steps + 1)])
        needed = steps if self.valid_time_forcing else steps - 1  # the last date whose forcings are given
        if roles.forcing and t + needed * self.lead >= dataset.n_times:
            raise DatasetError(
                f"a forecast of {steps} steps from {dataset.date(t)} needs data.forcing's store variables "
                f"{list(roles.forcing)} after the store's last date {dataset.date(dataset.n_times - 1)}"
            )
        given = [dataset.state(t + k * self.lead, self.points, member) for k in range(-self.history, 1)]
        # Later states are read only for store forcings, and only at dates whose forcings are
        # given; elsewhere the input stands in (its forcing columns unused).
        later = [
            dataset.state(t + k * self.lead, self.points, member) if roles.forcing and k <= needed else given[-1]
            for k in range(1, steps + 1)
        ]
        x, forcings = self._inputs(np.stack([*given, *later])[:, None], dates)
        return to_device(x, self.device), to_device(forcings, self.device)

    def _inputs(self, states: np.ndarray, dates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The model's input and the forcings ``(steps - 1, batch, local points, forcings)`` each
        later step is given, from ``states`` ``(history + steps + 1, batch, local points,
        variables)`` (the input's ``history`` earlier states, the input, then one a step) and
        ``dates`` ``(steps + 1, batch)`` (the input's, then one a step). The input ``(batch, local
        points, inputs)``: the prognostic states, oldest first, then the forcings. Step ``k``'s
        forcings: the store's forcing columns then the computed forcings at its input date, and
        (``valid_time_forcing``) the same again at its valid date."""
        roles, history = self.dataset.roles, self.history
        from_input = states[history:]
        at_dates = np.concatenate([from_input[..., roles.forcing_columns()], self._computed(dates)], axis=-1)
        per_step = at_dates[:-1]
        if self.valid_time_forcing:
            per_step = np.concatenate([at_dates[:-1], at_dates[1:]], axis=-1)
        prognostic = [s[..., roles.prognostic_columns()] for s in states[: history + 1]]
        x = np.concatenate([*prognostic, per_step[0]], axis=-1)
        return x, per_step[1:]

    def _computed(self, dates: np.ndarray) -> np.ndarray:
        """``(*dates.shape, local points, computed)`` computed forcings at ``dates`` (datetime64),
        each date's computed once."""
        at_dates = [self._computed_at(date) for date in dates.reshape(-1)]
        return np.stack(at_dates).reshape(*dates.shape, *at_dates[0].shape)

    def _computed_at(self, date: np.datetime64) -> np.ndarray:
        key = (int(date.astype("datetime64[s]").astype(np.int64)),)
        values = self._forcings.get(key)
        if values is None:
            lat, lon = self.dataset.latitudes[self.points], self.dataset.longitudes[self.points]
            values = self._forcings.put(key, computed_forcings(self.dataset.roles.computed, date[None], lat, lon)[0])
        return values


@dataclass
class Session:
    """One rank's view of a run: configuration, ranks, data, grids and model."""

    cfg: RunConfig
    dims: ParallelDims
    dataset: ZarrDataset
    hidden: HiddenGrid  # the processor's points
    grids: ShardedGrids
    model: Forecaster
    samples: Samples
    batches: Batches
    counter: CommCounter
    transport: Transport
    model_group: GroupLike  # what the model takes: the mp group, or shard_hybrid's sub-groups of it
    device: torch.device  # where the model, the graphs and the batches are

    @property
    def points(self) -> slice:
        """This rank's block of the data grid's points."""
        return self.batches.points


def open_session(cfg: RunConfig, dims: ParallelDims, horizon: int = 1) -> Session:
    """Set this rank up for ``cfg``: threads, device, dataset (checked, the same on every rank),
    the grids' shards and graphs, and the model (the same initial parameters on every rank,
    whatever the device; split when the strategy splits them), all on the device.
    ``horizon``: forecast steps each sample must have targets for."""
    t_cfg = cfg.trainer
    device = rank_device(t_cfg.device)
    torch.set_num_threads(t_cfg.threads_per_rank)
    set_freed_memory_policy(t_cfg.retain_freed_memory)
    dataset = open_dataset(cfg.data, rollout_horizon(t_cfg), cfg.model.multistep_input - 1)
    check_ranks_agree(cfg, dataset, dims)
    hidden = session_hidden_grid(cfg, dataset)
    grids = ShardedGrids.build(
        dataset.latitudes,
        dataset.longitudes,
        hidden,
        dims.mp,
        dims.mp_rank,
        cfg.model.encoder_neighbours,
        cfg.model.decoder_neighbours,
        cfg.model.mapper,
    ).to(device)
    torch.manual_seed(t_cfg.seed)  # the same parameters on every rank, drawn on the CPU
    model = build_model(cfg, dataset.roles, grids).to(device)
    model.processor.split_parameters(dims.mp_group)  # shard_channels keeps this rank's share
    model.split_node_parameters(grids)
    samples = dataset_samples(cfg.data, dataset, horizon, cfg.model.multistep_input - 1)
    points = slice(grids.data_layout.start, grids.data_layout.stop)
    if cfg.data.preload:  # first: the tendency statistics below then read from memory
        dataset.preload(points, select_members(dataset.n_members, cfg.data.members))  # where it fits
    if cfg.model.normalise_increments:  # a checkpoint loaded later brings its own
        starts = sorted({t for t, _ in samples.train})
        model.set_increment_statistics(*tendency_statistics(dataset, starts, samples.lead, points, dims.mp_group))
    counter = CommCounter()
    model_group = model.processor.build_groups(dims.mp_group)  # every rank of the world, together
    batches = Batches(dataset, grids, samples.lead, device, cfg.model.valid_time_forcing, cfg.model.multistep_input - 1)
    # Ranks sharing a GPU (tests only) stage their messages through host memory over gloo.
    transport = HostStagedTransport(counter) if cfg.debug.share_gpu else Transport(counter)
    return Session(cfg, dims, dataset, hidden, grids, model, samples, batches, counter, transport, model_group, device)


def session_hidden_grid(cfg: RunConfig, dataset: ZarrDataset) -> HiddenGrid:
    """The processor's grid of ``cfg.model`` for ``dataset`` (:mod:`training.model.hidden_grid`)."""
    m = cfg.model
    return hidden_grid(m.hidden_grid, m.hidden_stride, dataset.point_set, dataset.latitudes, dataset.longitudes)
