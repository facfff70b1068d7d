"""Agree on the shard layout (or any set of values) across ranks, or fail on every rank together.

A rank that raised on its own would leave the others waiting in the next collective until
the timeout. So each rank first reports what it sees (its problem, if any; batch, local
points, channels; a fingerprint of the configuration) in one small ``all_gather``, and every
rank then runs the same checks on the same table and raises the same ``ValueError``.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from enum import IntEnum
from types import MappingProxyType

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.shards import ShardLayout
from processor.distributed.transport import collective_device


class LocalProblem(IntEnum):
    """What a rank found wrong with its own input, sent to all ranks as a code."""

    NONE = 0
    NOT_3D = 1
    WRONG_CHANNELS = 2
    SIZES_WRONG_LENGTH = 3
    SIZE_DISAGREES = 4


_DESCRIPTIONS = MappingProxyType(
    {
        LocalProblem.NOT_3D: "input is not (batch, local_points, channels)",
        LocalProblem.WRONG_CHANNELS: "input has the wrong number of channels",
        LocalProblem.SIZES_WRONG_LENGTH: "shard_sizes does not have one entry per rank",
        LocalProblem.SIZE_DISAGREES: "local_points differs from shard_sizes[rank]",
    }
)


def fingerprint(values: Sequence[object]) -> int:
    """A stable 32-bit hash of a configuration, equal on every rank for equal values."""
    return zlib.crc32(repr(tuple(values)).encode())


def _as_text(values: Mapping[str, object]) -> dict[str, str]:
    """Keys and values as text, sorted by key: what rank-agreement compares."""
    return {str(k): v if isinstance(v, str) else repr(v) for k, v in sorted(values.items())}


def settings_fingerprint(values: Mapping[str, object]) -> int:
    """The fingerprint of a mapping of settings, as :func:`agree_on_values` compares them."""
    return fingerprint(list(_as_text(values).items()))


def _local_problem(x: Tensor, channels: int, world: int, rank: int, sizes: Sequence[int] | None) -> LocalProblem:
    if x.dim() != 3:
        return LocalProblem.NOT_3D
    if x.shape[2] != channels:
        return LocalProblem.WRONG_CHANNELS
    if sizes is not None and len(sizes) != world:
        return LocalProblem.SIZES_WRONG_LENGTH
    if sizes is not None and sizes[rank] != x.shape[1]:
        return LocalProblem.SIZE_DISAGREES
    return LocalProblem.NONE


def agree_on_layout(
    x: Tensor,
    group: dist.ProcessGroup,
    channels: int,
    config: Mapping[str, object],
    shard_sizes: Sequence[int] | None = None,
) -> ShardLayout:
    """Gather every rank's view of the input and return the common layout of points.

    Args:
        x: this rank's ``(batch, local_points, channels)`` block.
        channels: the channel count the model expects.
        config: settings that must be equal on every rank (all of the processor's); when they
            differ the error names the settings and the ranks.
        shard_sizes: optional expected points per rank; checked against the actual blocks.
    Raises:
        ValueError: on every rank, when any rank's input or configuration disagrees.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    problem = _local_problem(x, channels, world, rank, shard_sizes)
    shape = list(x.shape) if x.dim() == 3 else [-1, -1, -1]
    sizes_print = -1 if shard_sizes is None else fingerprint(shard_sizes)
    device = collective_device(group)
    mine = torch.tensor(
        [int(problem), *shape, settings_fingerprint(config), sizes_print], dtype=torch.int64, device=device
    )
    table = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    dist.all_gather_single(table, mine, group=group)
    rows = table.view(world, -1).tolist()

    for r, row in enumerate(rows):
        if row[0] != LocalProblem.NONE:
            detail = _DESCRIPTIONS[LocalProblem(row[0])]
            raise ValueError(
                f"rank {r} of the model-parallel group: {detail} (shape {tuple(row[1:4])}, channels {channels})"
            )
    batches = [row[1] for row in rows]
    if len(set(batches)) > 1:
        raise ValueError(f"batch size differs across ranks: {batches}")
    if batches[0] == 0:  # shard_heads' all-to-all cannot split an empty batch
        raise ValueError("the batch is empty (batch size 0 on every rank)")
    if len({row[4] for row in rows}) > 1:  # every rank takes this branch: it raises, naming the settings
        agree_on_values(config, group, what="processor settings")
        raise ValueError("processor settings differ across ranks")  # not reached: the line above names them
    given = {row[5] for row in rows}
    if len(given) > 1:
        raise ValueError("shard_sizes passed to forward differ across ranks")
    sizes = tuple(row[2] for row in rows)
    if any(s == 0 for s in sizes):
        raise ValueError(f"every rank needs at least one point; points per rank are {list(sizes)}")
    return ShardLayout(sizes, rank)


def agree_on_values(values: Mapping[str, object], group: dist.ProcessGroup | None = None, what: str = "values") -> None:
    """Return if ``values`` are equal on every rank of ``group``; else raise the same ``ValueError``
    on every rank, naming the ranks that differ from rank 0 and the keys that differ.

    One ``all_gather`` of a fingerprint; only when the fingerprints differ are the values
    themselves gathered, to name the keys.
    """
    items = _as_text(values)
    world = dist.get_world_size(group)
    device = collective_device(group)
    mine = torch.tensor([settings_fingerprint(values)], dtype=torch.int64, device=device)
    prints = torch.empty(world, dtype=torch.int64, device=device)
    dist.all_gather_single(prints, mine, group=group)
    if len(set(prints.tolist())) == 1:
        return
    every: list[dict[str, str]] = [{} for _ in range(world)]
    dist.all_gather_object(every, items, group=group)
    odd = [r for r in range(world) if every[r] != every[0]]
    keys = sorted({k for d in every for k in d if len({e.get(k) for e in every}) > 1})
    details = []
    for key in keys[:8]:
        by_value: dict[str, list[int]] = {}
        for r, d in enumerate(every):
            by_value.setdefault(d.get(key, "<missing>"), []).append(r)
        details.append(f"{key}: " + ", ".join(f"{v} on ranks {rs}" for v, rs in by_value.items()))
    more = f" (and {len(keys) - 8} more keys)" if len(keys) > 8 else ""
    raise ValueError(f"{what} differ between rank 0 and ranks {odd}: " + "; ".join(details) + more)
