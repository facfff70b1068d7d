"""What training, evaluation and prediction set up alike on every rank: the
dataset (checked against the configuration), this rank's blocks of the grids, the model, and
its batch loader (:class:`training.data.batches.Batches`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from processor.distributed import CommCounter, GroupLike, HostStagedTransport, Transport
from processor.matmul import set_matmul_backend
from processor.runtime import set_freed_memory_policy
from training.config.schema import RunConfig
from training.data import ZarrDataset
from training.data.batches import Batches
from training.data.climatology_input import HourlyClimatology
from training.data.open_store import dataset_samples, open_dataset, open_store
from training.data.samples import Sample, Samples, select_members
from training.data.tendencies import tendency_statistics
from training.distributed.device import rank_device
from training.distributed.parallel import ParallelDims
from training.distributed.ranks import check_ranks_agree
from training.model import Forecaster, ShardedGrids
from training.model.build import build_model
from training.model.field_forecast import fit_field_forecast
from training.model.hidden_grid import HiddenGrid, hidden_grid
from training.model.linear_baseline import LINEAR_REGRESSION, fit_linear_baseline, residual_statistics
from training.model.rollout import rollout_horizon


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
    trainer_cfg = cfg.trainer
    device = rank_device(trainer_cfg.device)
    torch.set_num_threads(trainer_cfg.threads_per_rank)
    set_matmul_backend("aten" if trainer_cfg.matmul == "auto" else trainer_cfg.matmul)  # auto: the launcher's pick
    set_freed_memory_policy(trainer_cfg.retain_freed_memory)
    dataset, hidden = open_data(cfg)
    check_ranks_agree(cfg, dataset, dims)
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
    torch.manual_seed(trainer_cfg.seed)  # the same parameters on every rank, drawn on the CPU
    model = build_model(cfg, dataset.roles, grids).to(device)
    model.processor.split_parameters(dims.mp_group)  # shard_channels keeps this rank's share
    model.split_node_parameters(grids)
    samples = dataset_samples(cfg.data, dataset, horizon, cfg.model.multistep_input - 1)
    points = slice(grids.data_layout.start, grids.data_layout.stop)
    if cfg.data.preload:  # first: the tendency statistics below then read from memory
        dataset.preload(points, select_members(dataset.n_members, cfg.data.members))  # where it fits
    counter = CommCounter()
    model_group = model.processor.build_groups(dims.mp_group)  # every rank of the world, together
    history = cfg.model.multistep_input - 1
    # What is fitted on the training dates reads the one-step samples, whatever the rollout:
    # evaluation and prediction open their session with a horizon of one and must fit the same.
    fitted_on = dataset_samples(cfg.data, dataset, 1, history).train
    climatology = HourlyClimatology.fit(dataset, points, fitted_on) if cfg.model.climatology_input else None
    batches = Batches(dataset, points, samples.lead, device, cfg.model.valid_time_forcing, history, climatology)
    learn_over_baseline(cfg, model, batches, fitted_on, dims.mp_group)
    # Ranks sharing a GPU (tests only) stage their messages through host memory over gloo.
    transport = HostStagedTransport(counter) if cfg.debug.share_gpu else Transport(counter)
    return Session(cfg, dims, dataset, hidden, grids, model, samples, batches, counter, transport, model_group, device)


def open_data(cfg: RunConfig, store: ZarrDataset | None = None) -> tuple[ZarrDataset, HiddenGrid]:
    """The run's dataset, checked against ``cfg`` (:func:`training.data.open_store.open_dataset`,
    for samples of the rollout's horizon), and the processor's grid of ``cfg.model`` for it
    (:mod:`training.model.hidden_grid`): what the launcher checks before any rank starts, and
    each rank opens again (``store``: opened already, see :func:`~training.data.open_store.open_dataset`)."""
    m = cfg.model
    if store is None:  # a rank: read as the launcher planned, where it left a plan
        store = open_store(cfg.data, plan_dir=cfg.run_dir)
    dataset = open_dataset(cfg.data, rollout_horizon(cfg.trainer), m.multistep_input - 1, store)
    hidden = hidden_grid(m.hidden_grid, m.hidden_stride, dataset.point_set, dataset.latitudes, dataset.longitudes)
    return dataset, hidden


def learn_over_baseline(
    cfg: RunConfig, model: Forecaster, batches: Batches, train: list[Sample], group: dist.ProcessGroup | None
) -> None:
    """What the model learns each step over (``model.baseline``), and in which units
    (``model.normalise_increments``): the latest state and the increment's statistics, or the
    linear regression fitted on this rank's points (no communication) and the statistics of what
    it leaves, from the one-step training samples ``train``, and (``model.field_input``) the
    whole-field forecast over it. A checkpoint loaded later brings its own statistics."""
    dataset, points = batches.dataset, batches.points
    if cfg.model.baseline == LINEAR_REGRESSION:
        baseline = fit_linear_baseline(batches, train)
        model.set_linear_baseline(baseline)
        if cfg.model.field_input:
            model.set_field_forecast(fit_field_forecast(batches, train, baseline))
        if cfg.model.normalise_increments:
            prognostic = len(dataset.roles.prognostic_columns())
            model.set_increment_statistics(*residual_statistics(baseline, batches, train, prognostic, group))
    elif cfg.model.normalise_increments:
        starts = sorted({t for t, _ in train})
        model.set_increment_statistics(*tendency_statistics(dataset, starts, batches.lead, points, group))
