"""Parameters split over the model-parallel ranks (``shard_channels``): which share a rank
holds, how to cut it from the full tensor, and how to put the full tensor back together.

The owning module records each split in its ``channel_splits`` dict (which survives
``deepcopy``, ``to_empty`` and tensor swaps), and :func:`mark_split_parameters` copies it onto
the parameters as their ``channel_split`` attribute, which the gradient reductions
(:mod:`processor.distributed.gradients`) read: they leave split parameters out of the
model-parallel sum, since each rank's gradient of its own share is already complete. The
processor re-marks its parameters at every forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from processor.distributed.region import gather_points
from processor.distributed.transport import Transport


@dataclass(frozen=True)
class ChannelSplit:
    """A tensor split along ``dim`` over ranks: ``dim`` holds ``groups`` equal parts (q, k, v
    for the fused projection, else one), each cut into consecutive blocks, ``sizes[r]`` rows
    of each part for rank ``r``."""

    dim: int
    sizes: tuple[int, ...]
    groups: int = 1

    def local(self, full: Tensor, rank: int) -> Tensor:
        """Rank ``rank``'s share of ``full``: ``groups * sizes[rank]`` rows along ``dim``."""
        total = sum(self.sizes)
        if full.shape[self.dim] != self.groups * total:
            raise ValueError(
                f"a tensor split as {self.groups} x {list(self.sizes)} along dim {self.dim} needs "
                f"{self.groups * total} rows there, got shape {tuple(full.shape)}"
            )
        start = sum(self.sizes[:rank])
        parts = full.split(total, dim=self.dim)
        return torch.cat([p.narrow(self.dim, start, self.sizes[rank]) for p in parts], dim=self.dim)

    def full(self, shares: Tensor) -> Tensor:
        """Every rank's share concatenated along ``dim`` in rank order -> the full tensor."""
        pieces = shares.split([self.groups * s for s in self.sizes], dim=self.dim)
        per_rank = [p.split(s, dim=self.dim) if s else [p] * self.groups for p, s in zip(pieces, self.sizes)]
        return torch.cat([per_rank[r][g] for g in range(self.groups) for r in range(len(self.sizes))], dim=self.dim)


def split_parameter(module: nn.Module, name: str, split: ChannelSplit, rank: int) -> None:
    """Replace ``module.<name>`` by rank ``rank``'s share, a new parameter marked with ``split``."""
    full = getattr(module, name)
    setattr(module, name, nn.Parameter(split.local(full.detach(), rank), requires_grad=full.requires_grad))
    module.__dict__.setdefault("channel_splits", {})[name] = split
    getattr(module, name).channel_split = split


def mark_split_parameters(model: nn.Module) -> int:
    """Put each split recorded by a module of ``model`` on its parameter again (a copy or a
    swap of the parameter object drops the attribute); returns how many are split."""
    count = 0
    for module in model.modules():
        for name, split in module.__dict__.get("channel_splits", {}).items():
            getattr(module, name).channel_split = split
            count += 1
    return count


def split_of(p: Tensor) -> ChannelSplit | None:
    """The parameter's :class:`ChannelSplit`, or None for a replicated one."""
    return getattr(p, "channel_split", None)


def gather_full(
    share: Tensor, split: ChannelSplit | None, group: dist.ProcessGroup | None, transport: Transport | None = None
) -> Tensor:
    """The full tensor of a split parameter's ``share`` (or of a tensor shaped like it, e.g. an
    optimiser moment), on every rank of ``group``; ``split=None`` (replicated): ``share``
    itself. Every rank of the group calls."""
    if split is None or len(split.sizes) == 1:
        return share.detach()
    if group is None or dist.get_world_size(group) != len(split.sizes):
        ranks = 1 if group is None else dist.get_world_size(group)
        raise ValueError(
            f"a parameter split over {len(split.sizes)} ranks needs its model-parallel group to be gathered, "
            f"got a group of {ranks}"
        )
    sizes = [split.groups * s for s in split.sizes]
    shares = gather_points(share.detach(), group, dim=split.dim, sizes=sizes, transport=transport, check=False)
    return split.full(shares)


def full_state_dict(
    module: nn.Module, group: dist.ProcessGroup | None, transport: Transport | None = None
) -> dict[str, Tensor]:
    """``module.state_dict()`` with every split parameter gathered into its full tensor: what
    one rank holding everything has, loadable on any rank count and strategy. Every rank of
    ``group`` calls; the gathers go through ``transport`` (default: the process group)."""
    splits = _splits_by_name(module)
    return {key: gather_full(value, splits.get(key), group, transport) for key, value in module.state_dict().items()}


def full_gradients(
    module: nn.Module, group: dist.ProcessGroup | None, transport: Transport | None = None
) -> dict[str, Tensor]:
    """``{name: gradient}`` of every parameter of ``module`` (as ``named_parameters`` names them),
    a split parameter's gradient gathered into its full tensor: the gradients one rank holding
    everything has. A parameter without a gradient gets zeros. Every rank of ``group`` calls."""
    grads = {}
    for name, p in module.named_parameters():
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = gather_full(grad, split_of(p), group, transport)
    return grads


def load_full_state_dict(module: nn.Module, state: dict[str, Tensor], rank: int) -> None:
    """Load a full state dict into ``module``, keeping rank ``rank``'s share of each split
    parameter."""
    splits = _splits_by_name(module)
    local = {}
    for key, value in state.items():
        split = splits.get(key)
        local[key] = value if split is None else split.local(value, rank)
    module.load_state_dict(local)


def full_optimizer_state(
    optimizer: torch.optim.Optimizer, group: dist.ProcessGroup | None, transport: Transport | None = None
) -> dict[str, object]:
    """``optimizer.state_dict()`` with the per-parameter tensors of split parameters (Adam's
    moments) gathered like the parameters (through ``transport``). Every rank of ``group``
    calls. Tensors of replicated parameters are the optimiser's own (not copies): save the
    result before the next step."""
    state = optimizer.state_dict()  # its per-parameter dicts are the live state: build new ones
    splits = _splits_by_index(optimizer)
    state["state"] = {
        index: {
            key: gather_full(value, splits[index], group, transport)
            if _shaped_like_share(value, index, splits)
            else value
            for key, value in entry.items()
        }
        for index, entry in state["state"].items()
    }
    return state


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, object], rank: int) -> None:
    """Load a state from :func:`full_optimizer_state` (or an unsplit optimiser), keeping this
    rank's share of each split parameter's tensors."""
    splits = _splits_by_index(optimizer)
    local = {**state, "state": {}}
    for index, entry in state["state"].items():  # type: ignore[union-attr]
        split = splits[index]
        local["state"][index] = {
            key: split.local(value, rank) if _shaped_like_share(value, index, splits) else value
            for key, value in entry.items()
        }
    optimizer.load_state_dict(local)


def _shaped_like_share(value: object, index: int, splits: dict[int, ChannelSplit | None]) -> bool:
    """Whether an optimiser state tensor belongs to a split parameter and is shaped like it
    (Adam's moments; scalars such as ``step`` are not)."""
    return isinstance(value, Tensor) and value.dim() > 0 and splits[index] is not None


def _splits_by_name(module: nn.Module) -> dict[str, ChannelSplit | None]:
    """Each parameter's split by its state-dict name, its marks renewed first."""
    mark_split_parameters(module)
    return {name: split_of(p) for name, p in module.named_parameters()}


def _splits_by_index(optimizer: torch.optim.Optimizer) -> dict[int, ChannelSplit | None]:
    """Each parameter's split by its index in the optimiser's state dict (groups in order)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {i: split_of(p) for i, p in enumerate(params)}
