"""Joining a run's ranks: this rank's place on the data- x model-parallel mesh, the heartbeat
that names a lost peer, and the check that every rank runs the same configuration on the same
dataset."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from processor.distributed import agree_on_values
from processor.runtime import Heartbeat
from training.config.schema import RunConfig, TrainerConfig
from training.config.settings import flatten, to_settings
from training.distributed.parallel import ParallelDims

if TYPE_CHECKING:
    from training.data import ZarrDataset


def join_ranks(trainer_cfg: TrainerConfig) -> tuple[ParallelDims, AbstractContextManager]:
    """This rank's data- x model-parallel dims, and the heartbeat to run under on several ranks:
    when a collective fails because another rank died, hung or raised, this rank raises
    :class:`~processor.runtime.PeerFailureError` naming it, within ``trainer.timeout_s`` (plus
    three heartbeats). ``trainer_cfg``: the run's ``trainer`` section."""
    dims = ParallelDims.build(trainer_cfg.ranks_per_model, trainer_cfg.placement)
    if dims.world == 1:
        return dims, nullcontext()
    return dims, Heartbeat.from_env(dims.rank, dims.world, trainer_cfg.heartbeat_s, trainer_cfg.timeout_s, dims.nodes)


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
