"""What training, evaluation and prediction set up alike on every rank: the ranks joined, the
dataset (checked against the configuration), this rank's blocks of the grids, the model, and
its batch loader (:class:`training.data.batches.Batches`)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from processor import TransformerProcessor
from processor.distributed import CommCounter, GroupLike, HostStagedTransport, Transport, agree_on_values
from processor.runtime import Heartbeat, set_freed_memory_policy
from training.config.schema import RunConfig, run_processor_config
from training.config.settings import flatten, to_settings
from training.data import ZarrDataset
from training.data.batches import Batches
from training.data.forcings import VariableRoles
from training.data.open_store import dataset_samples, open_dataset
from training.data.samples import Samples, select_members
from training.data.tendencies import tendency_statistics
from training.distributed.device import rank_device
from training.distributed.parallel import ParallelDims
from training.model import Forecaster, ShardedGrids
from training.model.hidden_grid import HiddenGrid, hidden_grid
from training.model.rollout import rollout_horizon


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
    history = cfg.model.multistep_input - 1
    batches = Batches(dataset, points, samples.lead, device, cfg.model.valid_time_forcing, history)
    # Ranks sharing a GPU (tests only) stage their messages through host memory over gloo.
    transport = HostStagedTransport(counter) if cfg.debug.share_gpu else Transport(counter)
    return Session(cfg, dims, dataset, hidden, grids, model, samples, batches, counter, transport, model_group, device)


def open_data(cfg: RunConfig) -> tuple[ZarrDataset, HiddenGrid]:
    """The run's dataset, checked against ``cfg`` (:func:`training.data.open_store.open_dataset`,
    for samples of the rollout's horizon), and the processor's grid of ``cfg.model`` for it
    (:mod:`training.model.hidden_grid`): what the launcher checks before any rank starts, and
    each rank opens again."""
    m = cfg.model
    dataset = open_dataset(cfg.data, rollout_horizon(cfg.trainer), m.multistep_input - 1)
    hidden = hidden_grid(m.hidden_grid, m.hidden_stride, dataset.point_set, dataset.latitudes, dataset.longitudes)
    return dataset, hidden
