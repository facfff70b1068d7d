"""The two layouts of a parity check: the configured one (the training run's ranks and
strategy) and the reference, run on the same ranks as copies of one smaller layout.

The reference holds every configured replica's batch in one replica (``batch_size`` times the
replicas), which reads the same samples in the same order (:func:`training.loop.trainer.sample_positions`):
a replica's loss is the mean over its batch and replicas' gradients are averaged, so one big
batch is the same sum. Every group of ``parity.reference`` consecutive ranks computes the same
reference, so no rank waits for another and no collective spans two copies.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from processor.distributed import parallelize_gradients
from processor.distributed.transport import collective_device
from training.config.checks import check_config
from training.config.schema import ConfigValueError, RunConfig, StrategyConfig
from training.distributed.parallel import ParallelDims


def check_parity(cfg: RunConfig, world: int) -> None:
    """Raise :class:`ConfigValueError` for a configuration two layouts cannot agree on, or a
    reference layout it cannot have on ``world`` ranks."""
    reference, per_model = cfg.parity.reference, cfg.trainer.ranks_per_model
    if cfg.model.dropout_p > 0:
        raise ConfigValueError(
            f"model.dropout_p = {cfg.model.dropout_p}: each layout draws its own dropout masks, so no two agree; "
            "give model.dropout_p=0 for the parity check"
        )
    if reference > per_model:
        raise ConfigValueError(
            f"parity.reference = {reference} is above trainer.ranks_per_model = {per_model}: the reference is "
            f"the smaller layout; give parity.reference <= {per_model}"
        )
    if reference == per_model == world:
        raise ConfigValueError(
            f"parity.reference = {reference} is the configured layout itself ({world} ranks, one replica): "
            f"give a smaller parity.reference (1: one rank)"
        )
    if world % reference:
        raise ConfigValueError(
            f"parity.reference = {reference} does not divide the {world} ranks, each group of which computes "
            "the reference: give a divisor"
        )
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        raise ConfigValueError(
            "torchrun --max-restarts > 0: a breach (exit code 4) would run the parity check again; "
            "give --max-restarts 0"
        )


def reference_config(cfg: RunConfig, world: int) -> RunConfig:
    """The reference layout's configuration for ``cfg`` on ``world`` ranks: ``parity.reference``
    ranks per model (strategy none on one rank), one replica with every replica's batch, no
    step hooks (``debug.hooks``: the reference is the unperturbed run). Raises
    :class:`ConfigValueError` naming ``parity.reference`` when the
    configuration cannot run on it."""
    reference = cfg.parity.reference
    replicas = world // cfg.trainer.ranks_per_model
    ref = copy.deepcopy(cfg)
    ref.trainer.ranks_per_model = ref.trainer.nprocs = reference
    ref.trainer.batch_size = cfg.trainer.batch_size * replicas
    ref.debug.hooks, ref.debug.hook_settings = [], {}
    if reference == 1:
        ref.strategy = StrategyConfig(name="none")
    try:
        check_config(ref, reference)
    except ConfigValueError as exc:
        raise ConfigValueError(f"parity.reference = {reference}: the reference layout cannot run this: {exc}") from None
    return ref


@dataclass(frozen=True)
class CopyDims(ParallelDims):
    """One model group of ``mp`` consecutive ranks inside a larger world whose every group
    computes the same thing: gradients and sums stay inside the group (``mp_group`` carries
    the processor's exchanges, ``gradient_group`` the gradient sums, apart as NCCL needs)."""

    gradient_group: dist.ProcessGroup | None = None

    def parallelize(self, model: nn.Module) -> nn.Module:
        return parallelize_gradients(model, mp_group=self.gradient_group)

    def _over_world(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=collective_device(None))
        dist.all_reduce(t, op=op, group=self.mp_group)
        return t.tolist()


@contextlib.contextmanager
def reference_layout(reference: int, configured: ParallelDims) -> Iterator[ParallelDims]:
    """This rank's place in the reference layout: alone for ``reference`` = 1, else in its
    group of ``reference`` consecutive ranks (every rank of the world enters, together); the
    groups made for it are destroyed on leaving."""
    first = configured.rank // reference * reference  # new_subgroups' groups are consecutive ranks
    nodes = configured.nodes[first : first + reference]
    if reference == 1:
        yield ParallelDims(1, 1, 0, None, None, nodes=nodes)
        return
    exchanges, _ = dist.new_subgroups(group_size=reference)
    gradients, _ = dist.new_subgroups(group_size=reference)
    rank = dist.get_rank(exchanges)
    try:
        yield CopyDims(reference, reference, rank, None, exchanges, 0, rank, nodes, gradient_group=gradients)
    finally:
        for group in (exchanges, gradients):
            dist.destroy_process_group(group)
